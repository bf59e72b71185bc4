//! Error numbers on the wire, and their explicit mapping to and from the host's values.
//!
//! The wire uses Linux's numbering (the guest is Linux), but nothing is passed through
//! unchecked: a host value is translated by name, and anything unknown becomes EIO, so a
//! host with other numbering (macOS, Windows) only needs its own table here.

/// An error number as carried on the wire (always positive, Linux numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WireErrno(pub u32);

macro_rules! wire_errnos {
    ($($name:ident = $val:expr, $libc:ident;)*) => {
        impl WireErrno {
            $(pub const $name: WireErrno = WireErrno($val);)*

            /// Translates a host errno (this host's libc numbering) to the wire.
            pub fn from_host(host: i32) -> WireErrno {
                $(if host == libc::$libc { return WireErrno::$name; })*
                WireErrno::EIO
            }

            /// Translates a wire errno to this machine's libc numbering.
            pub fn to_host(self) -> i32 {
                match self { $(WireErrno::$name => libc::$libc,)* _ => libc::EIO }
            }

            /// The symbolic name, for logs and error messages.
            pub fn name(self) -> &'static str {
                match self { $(WireErrno::$name => stringify!($name),)* _ => "E?" }
            }
        }
    };
}

wire_errnos! {
    EPERM = 1, EPERM;
    ENOENT = 2, ENOENT;
    EINTR = 4, EINTR;
    EIO = 5, EIO;
    ENXIO = 6, ENXIO;
    E2BIG = 7, E2BIG;
    EBADF = 9, EBADF;
    EAGAIN = 11, EAGAIN;
    ENOMEM = 12, ENOMEM;
    EACCES = 13, EACCES;
    EFAULT = 14, EFAULT;
    EBUSY = 16, EBUSY;
    EEXIST = 17, EEXIST;
    EXDEV = 18, EXDEV;
    ENODEV = 19, ENODEV;
    ENOTDIR = 20, ENOTDIR;
    EISDIR = 21, EISDIR;
    EINVAL = 22, EINVAL;
    ENFILE = 23, ENFILE;
    EMFILE = 24, EMFILE;
    ETXTBSY = 26, ETXTBSY;
    EFBIG = 27, EFBIG;
    ENOSPC = 28, ENOSPC;
    ESPIPE = 29, ESPIPE;
    EROFS = 30, EROFS;
    EMLINK = 31, EMLINK;
    EPIPE = 32, EPIPE;
    ERANGE = 34, ERANGE;
    EDEADLK = 35, EDEADLK;
    ENAMETOOLONG = 36, ENAMETOOLONG;
    ENOLCK = 37, ENOLCK;
    ENOSYS = 38, ENOSYS;
    ENOTEMPTY = 39, ENOTEMPTY;
    ELOOP = 40, ELOOP;
    ENODATA = 61, ENODATA;
    EPROTO = 71, EPROTO;
    EOVERFLOW = 75, EOVERFLOW;
    EOPNOTSUPP = 95, EOPNOTSUPP;
    ETIMEDOUT = 110, ETIMEDOUT;
    ESTALE = 116, ESTALE;
    EDQUOT = 122, EDQUOT;
}

impl std::fmt::Display for WireErrno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl From<std::io::Error> for WireErrno {
    fn from(e: std::io::Error) -> Self {
        e.raw_os_error()
            .map(WireErrno::from_host)
            .unwrap_or(WireErrno::EIO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_known_values_and_maps_unknown_to_eio() {
        for e in [
            WireErrno::ENOENT,
            WireErrno::ENOTEMPTY,
            WireErrno::ENODATA,
            WireErrno::ESTALE,
        ] {
            assert_eq!(WireErrno::from_host(e.to_host()), e);
        }
        assert_eq!(WireErrno::from_host(100_000), WireErrno::EIO);
        assert_eq!(WireErrno(9999).to_host(), libc::EIO);
        assert_eq!(WireErrno::EXDEV.name(), "EXDEV");
    }
}
