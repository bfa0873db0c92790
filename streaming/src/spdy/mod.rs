//! SPDY/3.1, as far as Kubernetes streaming needs it: the framing, header
//! compression and a server session with streams as byte pipes.
//!
//! No maintained Rust crate implements SPDY/3.1, and kubelet's clients
//! (client-go over moby/spdystream) still speak it, so it lives here.

mod dictionary;
pub mod frame;
pub mod headers;
pub mod session;

pub use frame::{Frame, FrameDecoder, FrameError};
pub use headers::{HeaderDecoder, HeaderEncoder, HeaderError, Headers};
pub use session::{Session, SessionConfig, SpdyStream};

#[cfg(test)]
pub(crate) mod tests_support {
    /// A small deterministic generator (xorshift64) so the fuzz-style tests
    /// need no random-number crate and always run the same inputs.
    pub(crate) struct XorShift(pub u64);
    impl XorShift {
        pub(crate) fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
    }
}
