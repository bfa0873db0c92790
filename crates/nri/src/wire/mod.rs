//! The NRI transport: ttrpc messages carried over two logical connections
//! multiplexed on one Unix socket.
//!
//! Why hand-written: ttrpc's framing is a 10-byte header around a protobuf
//! `Request`/`Response`, and NRI's multiplexer adds an 8-byte header per
//! chunk, so the whole transport is a few hundred lines on top of prost,
//! which the crate already uses for the NRI messages. The `ttrpc` crate
//! (containerd/ttrpc-rust) would bring a second protobuf stack (rust-protobuf,
//! or prost 0.13 next to our 0.14) and its own codegen, and its async server
//! wants to own listeners and sockets, while NRI needs both a client and a
//! server on virtual connections of one socket with per-call timeouts and
//! prompt close detection, which is what this module gives directly.
//!
//! Multiplexer frame (containerd/nri pkg/net/multiplex): u32 BE logical
//! connection id, u32 BE payload length, payload. Connection 1 carries the
//! plugin's services, connection 2 the runtime's. A logical connection is a
//! byte stream: a reader concatenates payloads.
//!
//! ttrpc message (containerd/ttrpc): u32 BE length, u32 BE stream id, u8
//! type (1 request, 2 response, 3 data), u8 flags, then `length` bytes of
//! protobuf. Clients use odd, increasing stream ids; messages are at most
//! 4 MiB.

mod conn;
mod messages;

pub(crate) use conn::{BoxFuture, CallError, Connection, Handler, Role};
pub(crate) use messages::{Code, Status};

/// Logical connection carrying the services a plugin serves.
pub(crate) const PLUGIN_SERVICE_CONN: u32 = 1;
/// Logical connection carrying the services the runtime serves.
pub(crate) const RUNTIME_SERVICE_CONN: u32 = 2;

const MUX_HEADER_LEN: usize = 8;
const TTRPC_HEADER_LEN: usize = 10;
/// Largest ttrpc message body either side accepts.
pub(crate) const MAX_MESSAGE_LEN: usize = 4 << 20;
/// Largest multiplexer chunk NRI's Go multiplexer accepts.
const MAX_MUX_PAYLOAD: usize = TTRPC_HEADER_LEN + MAX_MESSAGE_LEN;
/// Size of the first chunk of a message. Go's ttrpc reads through a 4096-byte
/// bufio.Reader and the Go multiplexer refuses a chunk larger than the read
/// buffer it is given, so messages are chunked exactly as Go's own writer
/// (a 4096-byte bufio.Writer) chunks them: the first 4096 bytes, then the
/// rest in one piece.
const FIRST_CHUNK: usize = 4096;

const TYPE_REQUEST: u8 = 1;
const TYPE_RESPONSE: u8 = 2;

/// Encodes one ttrpc message as the multiplexer chunks that carry it.
pub(crate) fn encode_message(conn: u32, stream: u32, kind: u8, body: &[u8]) -> Vec<u8> {
    let total = TTRPC_HEADER_LEN + body.len();
    let mut msg = Vec::with_capacity(total);
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes());
    msg.extend_from_slice(&stream.to_be_bytes());
    msg.push(kind);
    msg.push(0);
    msg.extend_from_slice(body);

    let mut out = Vec::with_capacity(total + 2 * MUX_HEADER_LEN);
    let (first, rest) = msg.split_at(total.min(FIRST_CHUNK));
    for chunk in [first, rest] {
        if chunk.is_empty() {
            continue;
        }
        debug_assert!(chunk.len() <= MAX_MUX_PAYLOAD);
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// One parsed ttrpc message.
#[derive(Debug, PartialEq)]
pub(crate) struct Message {
    pub stream: u32,
    pub kind: u8,
    pub body: Vec<u8>,
}

/// Reassembles the ttrpc messages of one logical connection.
#[derive(Default)]
pub(crate) struct Reassembler {
    buf: Vec<u8>,
}

impl Reassembler {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, if one is buffered.
    pub fn next_message(&mut self) -> Result<Option<Message>, String> {
        if self.buf.len() < TTRPC_HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.buf[0..4].try_into().unwrap()) as usize;
        if len > MAX_MESSAGE_LEN {
            return Err(format!(
                "ttrpc message of {len} bytes exceeds the maximum of {MAX_MESSAGE_LEN}"
            ));
        }
        if self.buf.len() < TTRPC_HEADER_LEN + len {
            return Ok(None);
        }
        let stream = u32::from_be_bytes(self.buf[4..8].try_into().unwrap());
        let kind = self.buf[8];
        let body = self.buf[TTRPC_HEADER_LEN..TTRPC_HEADER_LEN + len].to_vec();
        self.buf.drain(..TTRPC_HEADER_LEN + len);
        Ok(Some(Message { stream, kind, body }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_message_is_one_chunk_with_both_headers() {
        let out = encode_message(2, 7, TYPE_REQUEST, b"abc");
        assert_eq!(
            out,
            [
                0, 0, 0, 2, // logical connection
                0, 0, 0, 13, // chunk length: 10 + 3
                0, 0, 0, 3, // ttrpc body length
                0, 0, 0, 7, // stream id
                1, 0, // request, no flags
                b'a', b'b', b'c',
            ]
        );
    }

    #[test]
    fn large_message_is_chunked_as_go_writes_it() {
        let body = vec![0x5a; 10_000];
        let out = encode_message(1, 1, TYPE_RESPONSE, &body);
        // first chunk: 4096 bytes (header + 4086 of body), then the rest
        assert_eq!(&out[0..8], &[0, 0, 0, 1, 0, 0, 0x10, 0x00]);
        let second = 8 + 4096;
        assert_eq!(&out[second..second + 4], &[0, 0, 0, 1]);
        let rest = u32::from_be_bytes(out[second + 4..second + 8].try_into().unwrap());
        assert_eq!(rest as usize, 10 + 10_000 - 4096);
        assert_eq!(out.len(), 16 + 10 + 10_000);
    }

    #[test]
    fn reassembler_joins_split_chunks_and_splits_joined_messages() {
        let mut r = Reassembler::default();
        let a = encode_message(1, 1, TYPE_REQUEST, b"first");
        let b = encode_message(1, 3, TYPE_REQUEST, &vec![1u8; 5000]);
        // strip the mux headers: the reassembler sees the logical stream
        let strip = |v: &[u8]| {
            let mut out = Vec::new();
            let mut i = 0;
            while i < v.len() {
                let n = u32::from_be_bytes(v[i + 4..i + 8].try_into().unwrap()) as usize;
                out.extend_from_slice(&v[i + 8..i + 8 + n]);
                i += 8 + n;
            }
            out
        };
        let mut stream = strip(&a);
        stream.extend(strip(&b));
        r.push(&stream[..7]);
        assert_eq!(r.next_message().unwrap(), None);
        r.push(&stream[7..]);
        let m1 = r.next_message().unwrap().unwrap();
        assert_eq!(
            (m1.stream, m1.kind, &m1.body[..]),
            (1, TYPE_REQUEST, &b"first"[..])
        );
        let m2 = r.next_message().unwrap().unwrap();
        assert_eq!((m2.stream, m2.body.len()), (3, 5000));
        assert_eq!(r.next_message().unwrap(), None);
    }

    #[test]
    fn oversized_message_is_a_protocol_error() {
        let mut r = Reassembler::default();
        let mut hdr = ((MAX_MESSAGE_LEN + 1) as u32).to_be_bytes().to_vec();
        hdr.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
        r.push(&hdr);
        assert!(r.next_message().is_err());
    }
}
