//! Writes the seed inputs of every target to `fuzz/corpus/<target>/` (or to the directory
//! given as the only argument), one file per input, named after its content.
//!
//! cargo run -p tether-fuzz --example gen_corpus

use std::path::PathBuf;

fn name(data: &[u8]) -> String {
    // FNV-1a: stable names, so regenerating does not duplicate files.
    let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("seed-{h:016x}")
}

fn main() -> std::io::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus"));
    for (target, _) in tether_fuzz::TARGETS {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        let seeds = tether_fuzz::seeds::for_target(target);
        for s in &seeds {
            std::fs::write(dir.join(name(s)), s)?;
        }
        println!("{}: {} seeds", dir.display(), seeds.len());
    }
    Ok(())
}
