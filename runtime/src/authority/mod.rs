//! Serving gRPC clients whose HTTP/2 `:authority` is not an RFC 3986
//! authority: grpc-core (Python, C++, Ruby, PHP), grpc-java and
//! grpc-dotnet send the socket path (percent-encoded) on a Unix socket,
//! some send none or an empty one. The h2 server under tonic resets such
//! a stream (RST_STREAM PROTOCOL_ERROR) before any of crust's code sees
//! the request; containerd and CRI-O accept it, and so must crust.
//!
//! [`AuthorityFixed`] wraps each accepted connection: what the client
//! sends goes through a [`fixer::Fixer`], which rewrites just the header
//! blocks h2 would reject (`:authority: localhost`); what the server sends
//! passes untouched. Go clients (kubelet, crictl) send `localhost` and pay
//! only for the frame parse and the HPACK decode of their header blocks.

mod fixer;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use fixer::Fixer;
#[cfg(test)]
use fixer::{PREFACE, valid_authority};

/// Bytes read from the client per read (h2 reads in chunks of this size).
const READ_CHUNK: usize = 16 * 1024;

/// A connection whose client-to-server HTTP/2 header blocks carry an
/// authority h2 accepts.
pub struct AuthorityFixed<IO> {
    inner: IO,
    fixer: Fixer,
    /// Bytes ready for the server, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    scratch: Vec<u8>,
    eof: bool,
}

impl<IO> AuthorityFixed<IO> {
    pub fn new(inner: IO) -> AuthorityFixed<IO> {
        AuthorityFixed {
            inner,
            fixer: Fixer::default(),
            out: Vec::new(),
            out_pos: 0,
            scratch: Vec::new(),
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.inner
    }

    /// Header blocks rewritten so far.
    pub fn rewritten(&self) -> u64 {
        self.fixer.rewritten
    }
}

impl<IO> Drop for AuthorityFixed<IO> {
    fn drop(&mut self) {
        if self.rewritten() > 0 {
            tracing::debug!(
                requests = self.rewritten(),
                "a client's :authority was not an RFC 3986 authority (e.g. the socket path); served as \"localhost\""
            );
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFixed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = (this.out.len() - this.out_pos).min(buf.remaining());
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            // Nothing left to follow: read straight into the caller's buffer.
            if this.fixer.is_passthrough() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            this.scratch.resize(READ_CHUNK, 0);
            let mut rb = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                // A frame cut short stays cut short: h2 sees the EOF.
                this.fixer.finish(&mut this.out);
                this.eof = true;
                continue;
            }
            this.fixer
                .feed(&this.scratch[..n], &mut this.out)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityFixed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
