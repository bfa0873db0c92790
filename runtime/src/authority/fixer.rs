//! The client-to-server byte stream of one HTTP/2 connection, with every
//! header block whose `:authority` h2 would reject rewritten.
//!
//! Frames pass through as they arrive (a DATA payload is not held back),
//! except HEADERS and their CONTINUATIONs, which are collected until the
//! block ends (END_HEADERS) and decoded with an HPACK decoder that mirrors
//! the client's encoder (so the dynamic table stays in step). A block with
//! no invalid `:authority` goes on byte for byte. One with an invalid (or
//! empty) one is re-encoded with `:authority: localhost`, every field a
//! literal "without indexing", in frames of at most 16,384 bytes (the
//! HTTP/2 default SETTINGS_MAX_FRAME_SIZE, which h2 under tonic keeps).
//!
//! Re-encoding leaves h2's decoder without the entries the client's
//! encoder added to its table in that block, so from the first rewrite on
//! every later block of the connection is re-encoded too (h2's table then
//! no longer matters: nothing refers to it). Connections of clients that
//! send a valid authority (Go's: kubelet, crictl) never get there.
//!
//! Anything not HTTP/2 (no client preface) passes through untouched, and
//! so does the rest of a connection whose framing or HPACK this cannot
//! follow before anything was rewritten: h2 then answers it as it would
//! have. After a rewrite the same is a connection error.

use std::borrow::Cow;

use loona_hpack::Decoder;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frames this writes: the HTTP/2 default maximum frame size.
const MAX_OUT_FRAME: usize = 16_384;
/// The largest header block (compressed, all its frames) and decoded
/// header list (names and values plus 32 bytes per field, as RFC 7541
/// counts) this holds; a client sending more is not followed.
const MAX_BLOCK: usize = 1 << 20;
const MAX_DECODED: usize = 1 << 20;
/// The largest dynamic table a client may ask for (h2 offers 4,096).
const MAX_TABLE: usize = 64 << 10;
/// What replaces an authority h2 cannot parse.
pub const REPLACEMENT: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error)]
pub enum FixError {
    #[error("HTTP/2 header block after an :authority rewrite: {0}")]
    AfterRewrite(String),
}

#[derive(Debug)]
enum Mode {
    /// Matching the client preface; this many bytes matched so far.
    Preface(usize),
    Frames,
    /// Not HTTP/2, or no longer followed: bytes pass as they are.
    Passthrough,
}

/// A header block being collected: its frames as received, and the
/// HEADERS frame's flags and priority fields.
#[derive(Debug)]
struct Block {
    stream_id: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    raw: Vec<u8>,
}

pub struct Fixer {
    mode: Mode,
    /// Bytes received and not processed yet: a part of a frame header, or
    /// of a HEADERS / CONTINUATION frame.
    pending: Vec<u8>,
    /// Payload bytes of the current pass-through frame still to come.
    payload_left: usize,
    block: Option<Block>,
    decoder: Decoder<'static>,
    rewriting: bool,
    /// Blocks rewritten so far (tests, logs).
    pub rewritten: u64,
}

impl Default for Fixer {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE);
        Fixer {
            mode: Mode::Preface(0),
            pending: Vec::new(),
            payload_left: 0,
            block: None,
            decoder,
            rewriting: false,
            rewritten: 0,
        }
    }
}

impl Fixer {
    /// Whether the connection is past its preface and followed.
    #[cfg(test)]
    pub fn is_http2(&self) -> bool {
        matches!(self.mode, Mode::Frames)
    }

    /// Whether bytes now pass untouched for good.
    pub fn is_passthrough(&self) -> bool {
        matches!(self.mode, Mode::Passthrough)
    }

    /// Processes `data` received from the client, appending what the
    /// server is to read to `out`.
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), FixError> {
        while !data.is_empty() {
            match self.mode {
                Mode::Passthrough => {
                    out.extend_from_slice(&self.pending);
                    self.pending.clear();
                    out.extend_from_slice(data);
                    return Ok(());
                }
                Mode::Preface(matched) => {
                    let want = &PREFACE[matched..];
                    let n = want.len().min(data.len());
                    if data[..n] != want[..n] {
                        // Not HTTP/2 with prior knowledge: not ours to read.
                        out.extend_from_slice(&PREFACE[..matched]);
                        self.mode = Mode::Passthrough;
                        continue;
                    }
                    data = &data[n..];
                    self.mode = if matched + n == PREFACE.len() {
                        out.extend_from_slice(PREFACE);
                        Mode::Frames
                    } else {
                        Mode::Preface(matched + n)
                    };
                }
                Mode::Frames => {
                    if self.payload_left > 0 {
                        let n = self.payload_left.min(data.len());
                        out.extend_from_slice(&data[..n]);
                        self.payload_left -= n;
                        data = &data[n..];
                        continue;
                    }
                    let used = self.frame(data, out)?;
                    data = &data[used..];
                }
            }
        }
        Ok(())
    }

    /// The client closed its side: whatever is held (a preface or frame
    /// cut short) goes on as it came, for the server to judge.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if let Mode::Preface(matched) = self.mode {
            out.extend_from_slice(&PREFACE[..matched]);
        }
        if let Some(block) = self.block.take() {
            out.extend_from_slice(&block.raw);
        }
        out.extend_from_slice(&self.pending);
        self.pending.clear();
        self.mode = Mode::Passthrough;
    }

    /// Takes what it can of the next frame from `pending` + `data`;
    /// answers how much of `data` it used.
    fn frame(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<usize, FixError> {
        // The frame header, possibly split across reads.
        let have = self.pending.len();
        if have < FRAME_HEADER {
            let n = (FRAME_HEADER - have).min(data.len());
            self.pending.extend_from_slice(&data[..n]);
            if self.pending.len() < FRAME_HEADER {
                return Ok(n);
            }
            return self.after_header(out).map(|()| n);
        }
        // The rest of a header-block frame.
        let len = frame_len(&self.pending);
        let want = FRAME_HEADER + len - self.pending.len();
        let n = want.min(data.len());
        self.pending.extend_from_slice(&data[..n]);
        if self.pending.len() == FRAME_HEADER + len {
            self.header_frame(out)?;
        }
        Ok(n)
    }

    /// A frame header is complete in `pending`.
    fn after_header(&mut self, out: &mut Vec<u8>) -> Result<(), FixError> {
        let (len, kind) = (frame_len(&self.pending), self.pending[3]);
        let in_block = self.block.is_some();
        match kind {
            HEADERS | CONTINUATION if len <= MAX_BLOCK => {
                if len == 0 {
                    return self.header_frame(out);
                }
                Ok(())
            }
            // A frame that cannot come inside a header block, or one too
            // big to hold: not followed any further.
            _ if in_block || kind == HEADERS || kind == CONTINUATION => {
                self.give_up(out, "a header block this cannot follow")
            }
            _ => {
                out.extend_from_slice(&self.pending);
                self.pending.clear();
                self.payload_left = len;
                Ok(())
            }
        }
    }

    /// A HEADERS or CONTINUATION frame is complete in `pending`.
    fn header_frame(&mut self, out: &mut Vec<u8>) -> Result<(), FixError> {
        let frame = std::mem::take(&mut self.pending);
        let (kind, flags) = (frame[3], frame[4]);
        let stream_id = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        match (kind, self.block.as_mut()) {
            (HEADERS, None) => {
                let Some((priority, fragment)) = headers_fields(flags, payload) else {
                    self.pending = frame;
                    return self.give_up(out, "a malformed HEADERS frame");
                };
                self.block = Some(Block {
                    stream_id,
                    flags,
                    priority,
                    fragment: fragment.to_vec(),
                    raw: Vec::new(),
                });
            }
            (CONTINUATION, Some(block)) if block.stream_id == stream_id => {
                block.fragment.extend_from_slice(payload);
            }
            _ => {
                self.pending = frame;
                return self.give_up(out, "a CONTINUATION out of place");
            }
        }
        let block = self.block.as_mut().expect("a block is being collected");
        block.raw.extend_from_slice(&frame);
        if block.raw.len() > MAX_BLOCK {
            return self.give_up(out, "a header block over 1 MiB");
        }
        if flags & END_HEADERS != 0 {
            let block = self.block.take().expect("a block is being collected");
            return self.finish_block(block, out);
        }
        Ok(())
    }

    fn finish_block(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), FixError> {
        let fields = match decode(&mut self.decoder, &block.fragment) {
            Ok(f) => f,
            Err(why) => {
                self.block = Some(block);
                return self.give_up(out, &why);
            }
        };
        let invalid = fields
            .iter()
            .any(|(n, v)| n == b":authority" && !valid_authority(v));
        if !invalid && !self.rewriting {
            out.extend_from_slice(&block.raw);
            return Ok(());
        }
        if invalid {
            self.rewritten += 1;
        }
        self.rewriting = true;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        for (name, value) in &fields {
            let value: &[u8] = if name == b":authority" && !valid_authority(value) {
                REPLACEMENT
            } else {
                value
            };
            encode_literal(name, value, &mut encoded);
        }
        write_block(&block, &encoded, out);
        Ok(())
    }

    /// Stops following the connection: what is held goes on as received.
    /// Before any rewrite that is exactly the client's stream; after one,
    /// the server could no longer decode it, so it is an error.
    fn give_up(&mut self, out: &mut Vec<u8>, why: &str) -> Result<(), FixError> {
        if self.rewriting {
            return Err(FixError::AfterRewrite(why.to_string()));
        }
        tracing::debug!("HTTP/2 :authority adapter: {why}; passing the connection through");
        if let Some(block) = self.block.take() {
            out.extend_from_slice(&block.raw);
        }
        out.extend_from_slice(&self.pending);
        self.pending.clear();
        self.mode = Mode::Passthrough;
        Ok(())
    }
}

fn frame_len(header: &[u8]) -> usize {
    (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2])
}

/// A HEADERS payload's priority fields and block fragment, padding and
/// all checked; None if malformed.
fn headers_fields(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*p.first()?);
        p = &p[1..];
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        priority = Some(p.get(..5)?.try_into().ok()?);
        p = &p[5..];
    }
    let end = p.len().checked_sub(pad)?;
    Some((priority, &p[..end]))
}

/// Whether h2 accepts `value` as an `:authority` (it parses it with the
/// same function).
pub fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// Decodes a header block, bounded in the size it may decode to.
fn decode(decoder: &mut Decoder<'static>, fragment: &[u8]) -> Result<Fields, String> {
    let mut fields = Vec::new();
    let mut size = 0usize;
    let mut over = false;
    decoder
        .decode_with_cb(fragment, |n: Cow<[u8]>, v: Cow<[u8]>| {
            size += n.len() + v.len() + 32;
            if size > MAX_DECODED {
                over = true;
            }
            if !over {
                fields.push((n.into_owned(), v.into_owned()));
            }
        })
        .map_err(|e| format!("HPACK: {e}"))?;
    if over {
        return Err("a header list over 1 MiB".into());
    }
    Ok(fields)
}

/// A field as "literal header field without indexing, new name" (RFC
/// 7541 §6.2.2), strings as plain octets.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    for s in [name, value] {
        // Writing into a Vec cannot fail.
        let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// `encoded` as a HEADERS frame (the block's stream, END_STREAM and
/// priority kept, no padding) and as many CONTINUATIONs as it needs.
fn write_block(block: &Block, encoded: &[u8], out: &mut Vec<u8>) {
    let mut flags = block.flags & END_STREAM;
    let mut first: Vec<u8> = Vec::new();
    if let Some(p) = block.priority {
        flags |= PRIORITY;
        first.extend_from_slice(&p);
    }
    let room = MAX_OUT_FRAME - first.len();
    let (head, mut rest) = encoded.split_at(room.min(encoded.len()));
    first.extend_from_slice(head);
    let mut kind = HEADERS;
    let mut payload: &[u8] = &first;
    loop {
        let last = rest.is_empty();
        let f = if last { flags | END_HEADERS } else { flags };
        write_frame_header(out, payload.len(), kind, f, block.stream_id);
        out.extend_from_slice(payload);
        if last {
            return;
        }
        let (chunk, tail) = rest.split_at(MAX_OUT_FRAME.min(rest.len()));
        payload = chunk;
        rest = tail;
        kind = CONTINUATION;
        // CONTINUATION frames carry only END_HEADERS.
        flags = 0;
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream_id: u32) {
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
}
