//! SPDY/3 header blocks: the name/value block format and its zlib
//! compression with the SPDY/3 dictionary.
//!
//! One compression context per direction lives for the whole session: every
//! block is deflated into the same stream and ends with a sync flush, so a
//! block can only be read by a decompressor that read all the earlier ones.
//! A block that cannot be decompressed therefore breaks the session, while a
//! block that decompresses to garbage only breaks its stream.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::dictionary::DICTIONARY;

/// Header names (lowercase) and values; a value holding several values
/// separates them with NUL, as the wire does.
pub type Headers = Vec<(String, String)>;

/// Looks a header up by name, ignoring ASCII case.
pub fn get<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The zlib stream is broken: a session error.
    #[error("header block does not decompress: {0}")]
    Compression(String),
    /// The block inflates beyond the limit: a session error too, since the
    /// rest of it was never read into the shared context.
    #[error("header block inflates beyond {0} bytes")]
    TooLarge(usize),
    /// The block decompressed but its contents are malformed: a stream
    /// error.
    #[error("malformed header block: {0}")]
    Malformed(&'static str),
}

impl HeaderError {
    /// Whether the shared decompression context is still usable.
    pub fn is_session_error(&self) -> bool {
        !matches!(self, HeaderError::Malformed(_))
    }
}

/// Compresses outgoing header blocks.
pub struct HeaderEncoder {
    z: Compress,
    raw: Vec<u8>,
}

impl Default for HeaderEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderEncoder {
    pub fn new() -> Self {
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(&DICTIONARY)
            .expect("a fresh deflate stream takes a dictionary");
        HeaderEncoder { z, raw: Vec::new() }
    }

    /// Appends the compressed block for `headers` to `out`.
    pub fn encode(&mut self, headers: &[(&str, &str)], out: &mut Vec<u8>) {
        self.raw.clear();
        self.raw
            .extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            for s in [name.as_bytes(), value.as_bytes()] {
                self.raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
                self.raw.extend_from_slice(s);
            }
        }
        let mut input = &self.raw[..];
        loop {
            out.reserve(input.len() + 64);
            let before_in = self.z.total_in();
            let before_out = self.z.total_out();
            let status = self
                .z
                .compress_vec(input, out, FlushCompress::Sync)
                .expect("deflate into a growing buffer does not fail");
            let consumed = (self.z.total_in() - before_in) as usize;
            let produced = (self.z.total_out() - before_out) as usize;
            input = &input[consumed..];
            // A sync flush is complete when all input is in and the output
            // buffer was not filled to the brim.
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            if consumed == 0 && produced == 0 && !matches!(status, Status::Ok) {
                break;
            }
        }
    }
}

/// Decompresses incoming header blocks.
pub struct HeaderDecoder {
    z: Decompress,
    max: usize,
    out: Vec<u8>,
}

impl HeaderDecoder {
    /// `max` bounds the size of one decompressed block.
    pub fn new(max: usize) -> Self {
        HeaderDecoder {
            z: Decompress::new(true),
            max,
            out: Vec::new(),
        }
    }

    /// Decompresses and parses one block.
    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, HeaderError> {
        self.inflate(block)?;
        parse_block(&self.out)
    }

    fn inflate(&mut self, block: &[u8]) -> Result<(), HeaderError> {
        self.out.clear();
        let mut input = block;
        let mut chunk = [0u8; 4096];
        loop {
            let before_in = self.z.total_in();
            let before_out = self.z.total_out();
            let result = self.z.decompress(input, &mut chunk, FlushDecompress::Sync);
            let consumed = (self.z.total_in() - before_in) as usize;
            let produced = (self.z.total_out() - before_out) as usize;
            input = &input[consumed..];
            if self.out.len() + produced > self.max {
                return Err(HeaderError::TooLarge(self.max));
            }
            self.out.extend_from_slice(&chunk[..produced]);
            match result {
                Ok(Status::StreamEnd) => {
                    // A SPDY header stream never ends; more blocks follow.
                    return Err(HeaderError::Compression("zlib stream ended".into()));
                }
                Ok(_) => {}
                Err(e) => match e.needs_dictionary() {
                    Some(_) => {
                        // zlib-rs checks the Adler-32 id of the dictionary.
                        self.z.set_dictionary(&DICTIONARY).map_err(|e| {
                            HeaderError::Compression(format!("wrong dictionary: {e}"))
                        })?;
                        continue;
                    }
                    None => return Err(HeaderError::Compression(e.to_string())),
                },
            }
            if input.is_empty() && produced < chunk.len() {
                return Ok(());
            }
            if consumed == 0 && produced == 0 {
                // No progress with input left: the block is truncated
                // mid-symbol, which a sync-flushed block never is.
                return Err(HeaderError::Compression("truncated header block".into()));
            }
        }
    }
}

fn parse_block(mut b: &[u8]) -> Result<Headers, HeaderError> {
    fn u32_at(b: &mut &[u8]) -> Result<usize, HeaderError> {
        if b.len() < 4 {
            return Err(HeaderError::Malformed("truncated length"));
        }
        let v = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        *b = &b[4..];
        Ok(v)
    }
    fn bytes<'a>(b: &mut &'a [u8]) -> Result<&'a [u8], HeaderError> {
        let len = u32_at(b)?;
        if b.len() < len {
            return Err(HeaderError::Malformed("length beyond block"));
        }
        let (s, rest) = b.split_at(len);
        *b = rest;
        Ok(s)
    }
    let count = u32_at(&mut b)?;
    // Every pair takes at least 8 bytes: a count larger than that is a lie.
    if count > b.len() / 8 {
        return Err(HeaderError::Malformed("pair count beyond block"));
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let name = bytes(&mut b)?;
        let value = bytes(&mut b)?;
        if name.is_empty() {
            return Err(HeaderError::Malformed("empty header name"));
        }
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        if headers.iter().any(|(n, _): &(String, String)| *n == name) {
            return Err(HeaderError::Malformed("duplicate header name"));
        }
        headers.push((name, String::from_utf8_lossy(value).into_owned()));
    }
    if !b.is_empty() {
        return Err(HeaderError::Malformed("trailing bytes after header pairs"));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(h: &Headers) -> Vec<(&str, &str)> {
        h.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
    }

    #[test]
    fn dictionary_has_the_spdy3_id() {
        // The dictionary id every SPDY/3 peer puts in its zlib header.
        let (mut a, mut b) = (1u32, 0u32);
        for &x in DICTIONARY.iter() {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }

    /// Two consecutive blocks deflated by C zlib (node's zlib module, with
    /// the SPDY/3 dictionary and Z_SYNC_FLUSH after each), as a port-forward
    /// client sends them. The second only decodes with the first's context.
    #[test]
    fn decodes_known_vectors_from_an_independent_zlib() {
        let b1 = hex(
            "78bbe3c6a7c202253a703a2b294a4dcc851625aca9a0808614cb45e01c60616061c0c0c0c0590489c64c50f2663400000000ffff",
        );
        let b2 = hex("c2aa19540e2512d60b000000ffff");
        let mut dec = HeaderDecoder::new(1 << 16);
        let h1 = dec.decode(&b1).unwrap();
        assert_eq!(
            pairs(&h1),
            vec![
                ("streamtype", "error"),
                ("port", "8080"),
                ("requestid", "0")
            ]
        );
        let h2 = dec.decode(&b2).unwrap();
        assert_eq!(
            pairs(&h2),
            vec![("streamtype", "data"), ("port", "8080"), ("requestid", "0")]
        );
        // Without the first block's context the second is garbage.
        assert!(HeaderDecoder::new(1 << 16).decode(&b2).is_err());
    }

    #[test]
    fn encoder_and_decoder_share_a_context_per_direction() {
        let mut enc = HeaderEncoder::new();
        let mut dec = HeaderDecoder::new(1 << 16);
        let mut sizes = Vec::new();
        for i in 0..50 {
            let id = i.to_string();
            let h: Vec<(&str, &str)> =
                vec![("streamtype", "data"), ("port", "80"), ("requestid", &id)];
            let mut out = Vec::new();
            enc.encode(&h, &mut out);
            assert_eq!(
                &out[out.len() - 4..],
                &[0, 0, 0xff, 0xff],
                "sync flush marker"
            );
            sizes.push(out.len());
            let got = dec.decode(&out).unwrap();
            assert_eq!(pairs(&got), h);
        }
        // Later blocks compress against the earlier ones.
        assert!(sizes[10] < sizes[0]);
        let mut out = Vec::new();
        enc.encode(&[], &mut out);
        assert!(dec.decode(&out).unwrap().is_empty());
    }

    #[test]
    fn first_block_starts_with_the_dictionary_id() {
        let mut out = Vec::new();
        HeaderEncoder::new().encode(&[("a", "b")], &mut out);
        // CMF/FLG with FDICT set, then the dictionary's Adler-32.
        assert_eq!(out[1] & 0x20, 0x20);
        assert_eq!(&out[2..6], &[0xe3, 0xc6, 0xa7, 0xc2]);
    }

    #[test]
    fn oversized_block_is_refused() {
        let big = "x".repeat(10_000);
        let mut out = Vec::new();
        HeaderEncoder::new().encode(&[("big", &big)], &mut out);
        let err = HeaderDecoder::new(4096).decode(&out).unwrap_err();
        assert_eq!(err, HeaderError::TooLarge(4096));
        assert!(err.is_session_error());
    }

    #[test]
    fn malformed_contents_are_stream_errors() {
        // Deflate raw blocks that are not valid name/value blocks.
        for raw in [
            &[0u8, 0, 0, 5][..],                       // count beyond block
            &[0, 0, 0, 1, 0, 0, 0, 9, b'a'][..],       // name beyond block
            &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0][..], // empty name
            &[0, 0, 0, 0, 1][..],                      // trailing byte
            &[0, 0, 0][..],                            // truncated count
        ] {
            let mut z = Compress::new(Compression::default(), true);
            z.set_dictionary(&DICTIONARY).unwrap();
            let mut out = Vec::with_capacity(256);
            z.compress_vec(raw, &mut out, FlushCompress::Sync).unwrap();
            let err = HeaderDecoder::new(1 << 16).decode(&out).unwrap_err();
            assert!(!err.is_session_error(), "{raw:?}: {err}");
        }
    }

    #[test]
    fn garbage_is_a_compression_error() {
        let err = HeaderDecoder::new(1 << 16)
            .decode(b"\x00\x01\x02\x03garbage")
            .unwrap_err();
        assert!(err.is_session_error());
        // A zlib header asking for another dictionary.
        let err = HeaderDecoder::new(1 << 16)
            .decode(&hex("78bb0000000100000000ffff"))
            .unwrap_err();
        assert!(err.is_session_error());
    }

    proptest::proptest! {
        #![proptest_config(crust_quote::testing::config(512))]

        /// A block that claims up to 4 billion pairs is refused before
        /// anything is allocated for them; a real one parses.
        #[test]
        fn pair_counts_never_outrun_the_block(
            count in proptest::prelude::any::<u32>(),
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let mut raw = count.to_be_bytes().to_vec();
            raw.extend_from_slice(&body);
            let mut z = Compress::new(Compression::default(), true);
            z.set_dictionary(&DICTIONARY).unwrap();
            let mut block = Vec::with_capacity(raw.len() + 256);
            z.compress_vec(&raw, &mut block, FlushCompress::Sync).unwrap();
            match HeaderDecoder::new(4096).decode(&block) {
                Ok(h) => proptest::prop_assert!(h.len() <= body.len() / 8),
                Err(e) => proptest::prop_assert!(!e.is_session_error(), "{}", e),
            }
        }
    }

    #[test]
    fn random_blocks_never_panic() {
        let mut rng = crate::spdy::tests_support::XorShift(42);
        for _ in 0..5_000 {
            let mut dec = HeaderDecoder::new(1024);
            let len = (rng.next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if len > 6 && rng.next().is_multiple_of(2) {
                bytes[..6].copy_from_slice(&[0x78, 0xbb, 0xe3, 0xc6, 0xa7, 0xc2]);
            }
            let _ = dec.decode(&bytes);
            let _ = dec.decode(&bytes);
        }
    }
}
