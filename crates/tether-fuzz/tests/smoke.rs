//! The CI fuzz smoke: every corpus file and seed, then a few thousand deterministic
//! pseudo-random and mutated inputs, through each target (docs/fuzzing.md).

use std::path::PathBuf;

#[global_allocator]
static ALLOC: tether_fuzz::TrackingAlloc = tether_fuzz::TrackingAlloc;

/// splitmix64: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    11,
    12,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 20,
    u64::MAX,
];

/// A libFuzzer-like mutation of `input` (sometimes spliced with `other`).
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = v.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next() as u8;
            }
            2 if len > 0 => {
                // An interesting value over 1, 2, 4 or 8 bytes, little-endian.
                let w = 1 << rng.below(4);
                let i = rng.below(len);
                let val = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let n = w.min(len - i);
                v[i..i + n].copy_from_slice(&val[..n]);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = rng.below(len - i + 1);
                v.drain(i..i + n);
            }
            4 => {
                let i = rng.below(len + 1);
                let n = rng.below(16) + 1;
                let junk = rng.bytes(n);
                v.splice(i..i, junk);
            }
            5 if len > 0 => {
                // Duplicate a range (repeated frames, repeated fields).
                let i = rng.below(len);
                let n = rng.below((len - i).min(64)) + 1;
                let part = v[i..i + n].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, part);
            }
            6 if !other.is_empty() => {
                // Splice: a prefix of this input, a suffix of the other.
                let i = rng.below(len + 1);
                let j = rng.below(other.len());
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            _ => v.truncate(rng.below(len + 1)),
        }
    }
    v
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs one input; on a panic, says which input it was before the test fails.
fn run(target: &str, f: fn(&[u8]), data: &[u8]) {
    struct Report<'a>(&'a str, &'a [u8]);
    impl Drop for Report<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("target {} failed on input {}", self.0, hex(self.1));
            }
        }
    }
    let _report = Report(target, data);
    f(data);
}

/// The committed corpus of `target` plus its built-in seeds.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut inputs = tether_fuzz::seeds::for_target(target);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            inputs.push(std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
        }
    }
    inputs
}

fn smoke(target: &str, random: usize, mutated: usize, max_len: usize) {
    let f = tether_fuzz::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .expect("a target")
        .1;
    let inputs = corpus(target);
    for input in &inputs {
        run(target, f, input);
    }
    let mut rng = Rng(0x7e7e_f022 ^ target.len() as u64);
    for _ in 0..random {
        let n = rng.below(max_len);
        let data = rng.bytes(n);
        run(target, f, &data);
    }
    for _ in 0..mutated {
        let a = &inputs[rng.below(inputs.len())];
        let b = &inputs[rng.below(inputs.len())];
        let data = mutate(&mut rng, a, b);
        run(target, f, &data);
    }
}

#[test]
fn frame() {
    smoke("frame", 2000, 4000, 256);
}

#[test]
fn messages() {
    smoke("messages", 2000, 4000, 256);
}

#[test]
fn session() {
    smoke("session", 500, 2000, 512);
}

#[test]
fn secret_search_finds_the_secret_anywhere() {
    use tether_fuzz::session::{contains_secret, SECRET};
    for at in [0, 1, 31, 100] {
        let mut hay = vec![0xaa; at];
        hay.extend_from_slice(&SECRET);
        hay.extend_from_slice(&[0x55; 7]);
        assert!(contains_secret(&hay), "at {at}");
        hay[at + 31] ^= 1;
        assert!(!contains_secret(&hay), "altered at {at}");
    }
    assert!(!contains_secret(&SECRET[1..]));
}

#[test]
fn memory_bounds_are_measured() {
    // The smoke binary installs the tracking allocator, so the targets' bounds are checked.
    let scope = tether_fuzz::MemScope::start();
    let v = vec![0u8; 1 << 20];
    assert!(tether_fuzz::MemScope::installed());
    assert!(scope.largest() >= 1 << 20 && scope.peak_growth() >= 1 << 20);
    drop(v);
}
