//! The :authority adapter against hand-made HTTP/2 byte streams: RFC 7541
//! Appendix C's request examples (with and without Huffman coding), the
//! same with an authority h2 rejects, header blocks written by an
//! independent HPACK encoder, frames split anywhere, padding, priority,
//! CONTINUATIONs, and input that is not HTTP/2 or not valid.

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn fields(list: &[(&str, &str)]) -> Fields {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const HEADERS: u8 = 1;
const CONTINUATION: u8 = 9;
const DATA: u8 = 0;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;
const PADDED: u8 = 8;
const PRIORITY: u8 = 0x20;

/// A client's connection start: preface and an empty SETTINGS frame.
fn preface() -> Vec<u8> {
    let mut v = PREFACE.to_vec();
    v.extend(frame(4, 0, 0, &[]));
    v
}

/// Everything the fixer makes of `input`, fed in pieces of `chunk` bytes.
fn run(input: &[u8], chunk: usize) -> (Vec<u8>, Fixer) {
    let mut fixer = Fixer::default();
    let mut out = Vec::new();
    for piece in input.chunks(chunk) {
        fixer.feed(piece, &mut out).unwrap();
    }
    fixer.finish(&mut out);
    (out, fixer)
}

/// One frame as the server sees it.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The frames of a server-side stream (after the preface).
fn frames(mut b: &[u8]) -> Vec<Frame> {
    assert!(b.starts_with(PREFACE));
    b = &b[PREFACE.len()..];
    let mut v = Vec::new();
    while !b.is_empty() {
        let len = (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
        v.push(Frame {
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]),
            payload: b[9..9 + len].to_vec(),
        });
        b = &b[9 + len..];
    }
    v
}

/// The header lists the server decodes (one decoder for the connection,
/// as h2 has), checking the framing rules on the way.
fn server_view(out: &[u8]) -> Vec<(u32, u8, Fields)> {
    let mut decoder = Decoder::new();
    let mut blocks = Vec::new();
    let mut open: Option<(u32, u8, Vec<u8>)> = None;
    for f in frames(out) {
        assert!(
            f.payload.len() <= 16_384,
            "frame of {} bytes",
            f.payload.len()
        );
        match f.kind {
            HEADERS => {
                assert!(open.is_none(), "HEADERS inside a block");
                let mut p = &f.payload[..];
                let mut pad = 0;
                if f.flags & PADDED != 0 {
                    pad = usize::from(p[0]);
                    p = &p[1..];
                }
                if f.flags & PRIORITY != 0 {
                    p = &p[5..];
                }
                open = Some((f.stream, f.flags, p[..p.len() - pad].to_vec()));
            }
            CONTINUATION => {
                let o = open.as_mut().expect("CONTINUATION outside a block");
                assert_eq!(o.0, f.stream);
                assert_eq!(f.flags & !END_HEADERS, 0, "CONTINUATION flags");
                o.2.extend_from_slice(&f.payload);
            }
            _ => assert!(open.is_none(), "frame {} inside a block", f.kind),
        }
        let ended = matches!(f.kind, HEADERS | CONTINUATION) && f.flags & END_HEADERS != 0;
        if ended {
            let (stream, flags, block) = open.take().unwrap();
            blocks.push((
                stream,
                flags,
                decoder.decode(&block).expect("h2 can decode"),
            ));
        }
    }
    assert!(open.is_none(), "a block left open");
    blocks
}

/// RFC 7541 C.3: three requests without Huffman coding.
fn c3() -> [Vec<u8>; 3] {
    [
        hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
        hex("8286 84be 5808 6e6f 2d63 6163 6865"),
        hex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65"),
    ]
}

/// RFC 7541 C.4: the same requests with Huffman coding.
fn c4() -> [Vec<u8>; 3] {
    [
        hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        hex("8286 84be 5886 a8eb 1064 9cbf"),
        hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    ]
}

fn c_expected(authority: &str) -> [Fields; 3] {
    [
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", authority),
        ]),
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", authority),
            ("cache-control", "no-cache"),
        ]),
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", authority),
            ("custom-key", "custom-value"),
        ]),
    ]
}

fn requests(blocks: &[Vec<u8>]) -> Vec<u8> {
    let mut input = preface();
    for (i, b) in blocks.iter().enumerate() {
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            2 * i as u32 + 1,
            b,
        ));
    }
    input
}

#[test]
fn rfc7541_examples_with_a_valid_authority_pass_byte_for_byte() {
    for blocks in [c3(), c4()] {
        let input = requests(&blocks);
        for chunk in [1, 7, 4096] {
            let (out, fixer) = run(&input, chunk);
            assert_eq!(out, input, "chunk {chunk}");
            assert_eq!(fixer.rewritten, 0);
        }
        let view = server_view(&input);
        let got: Vec<Fields> = view.into_iter().map(|(_, _, f)| f).collect();
        assert_eq!(got, c_expected("www.example.com"));
    }
}

#[test]
fn rfc7541_examples_with_a_socket_path_authority_are_rewritten() {
    // C.3 with the 15-byte authority literal (indexed into the dynamic
    // table, and referred to from there by the next two requests)
    // replaced by a 15-byte socket path.
    let mut blocks = c3();
    let at = blocks[0].len() - 15;
    blocks[0][at..].copy_from_slice(b"/tmp/crust.sock");
    assert!(!valid_authority(b"/tmp/crust.sock"));
    let input = requests(&blocks);
    for chunk in [1, 3, 9, 10, 4096] {
        let (out, fixer) = run(&input, chunk);
        assert_eq!(fixer.rewritten, 3, "chunk {chunk}");
        let view = server_view(&out);
        let got: Vec<Fields> = view.iter().map(|(_, _, f)| f.clone()).collect();
        assert_eq!(got, c_expected("localhost"));
        let streams: Vec<(u32, u8)> = view.iter().map(|(s, f, _)| (*s, *f)).collect();
        assert_eq!(
            streams,
            vec![
                (1, END_STREAM | END_HEADERS),
                (3, END_STREAM | END_HEADERS),
                (5, END_STREAM | END_HEADERS)
            ]
        );
    }
}

/// What grpc-core sends on a Unix socket, through an independent encoder
/// that indexes new fields into its dynamic table.
fn grpc_core_request(path: &str, authority: &str) -> Fields {
    fields(&[
        (":path", path),
        (":authority", authority),
        (":method", "POST"),
        (":scheme", "http"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        (
            "user-agent",
            "grpc-python/1.85.1 grpc-c/58.0.0 (linux; chttp2)",
        ),
    ])
}

fn encode(enc: &mut Encoder<'_>, f: &Fields) -> Vec<u8> {
    enc.encode(f.iter().map(|(n, v)| (&n[..], &v[..])))
}

#[test]
fn a_valid_connection_then_a_rewrite_keeps_the_server_decoding_right() {
    let mut enc = Encoder::new();
    let sent = [
        grpc_core_request("/runtime.v1.RuntimeService/Version", "localhost"),
        grpc_core_request("/runtime.v1.RuntimeService/Version", "localhost"),
        grpc_core_request(
            "/runtime.v1.RuntimeService/ListPodSandbox",
            "%2Frun%2Fcrust.sock",
        ),
        grpc_core_request(
            "/runtime.v1.RuntimeService/ListPodSandbox",
            "%2Frun%2Fcrust.sock",
        ),
        grpc_core_request("/runtime.v1.RuntimeService/Version", "localhost"),
        grpc_core_request("/runtime.v1.RuntimeService/Version", ""),
    ];
    let mut input = preface();
    let mut first_two = preface();
    for (i, f) in sent.iter().enumerate() {
        let stream = 2 * i as u32 + 1;
        let block = encode(&mut enc, f);
        let h = frame(HEADERS, END_HEADERS, stream, &block);
        let d = frame(DATA, END_STREAM, stream, b"\0\0\0\0\0");
        input.extend(&h);
        input.extend(&d);
        if i < 2 {
            first_two.extend(&h);
            first_two.extend(&d);
        }
    }
    let (out, fixer) = run(&input, 5);
    // Untouched until the first invalid authority.
    assert!(out.starts_with(&first_two));
    assert_eq!(fixer.rewritten, 3);
    let view = server_view(&out);
    assert_eq!(view.len(), sent.len());
    for (i, (stream, _, got)) in view.iter().enumerate() {
        assert_eq!(*stream, 2 * i as u32 + 1);
        let mut want = sent[i].clone();
        if !valid_authority(&want[1].1) {
            want[1].1 = b"localhost".to_vec();
        }
        assert_eq!(got, &want, "request {i}");
    }
    // DATA frames came through as they were.
    let data: Vec<Frame> = frames(&out)
        .into_iter()
        .filter(|f| f.kind == DATA)
        .collect();
    assert_eq!(data.len(), sent.len());
    assert!(
        data.iter()
            .all(|f| f.payload == b"\0\0\0\0\0" && f.flags == END_STREAM)
    );
}

#[test]
fn padding_priority_and_continuations_are_followed() {
    let mut enc = Encoder::new();
    let mut big = grpc_core_request("/runtime.v1.RuntimeService/Version", "/run/crust.sock");
    // Past one frame once re-encoded: 3 x 9,000 bytes of metadata.
    for i in 0..3 {
        big.push((
            format!("x-big-{i}").into_bytes(),
            vec![b'a' + i as u8; 9000],
        ));
    }
    let block = encode(&mut enc, &big);
    // HEADERS (padded, with priority) + two CONTINUATIONs.
    let (a, rest) = block.split_at(100);
    let (b, c) = rest.split_at(rest.len() / 2);
    let mut payload = vec![4u8];
    payload.extend_from_slice(&[0x80, 0, 0, 3, 200]);
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0; 4]);
    let mut input = preface();
    input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &payload));
    input.extend(frame(CONTINUATION, 0, 1, b));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, c));
    let (out, fixer) = run(&input, 1000);
    assert_eq!(fixer.rewritten, 1);
    let fs = frames(&out);
    let headers = fs.iter().find(|f| f.kind == HEADERS).unwrap();
    assert_eq!(
        headers.flags,
        PRIORITY | END_STREAM,
        "no padding, no END_HEADERS yet"
    );
    assert_eq!(&headers.payload[..5], &[0x80, 0, 0, 3, 200]);
    assert!(fs.iter().filter(|f| f.kind == CONTINUATION).count() >= 1);
    let view = server_view(&out);
    big[1].1 = b"localhost".to_vec();
    assert_eq!(view.len(), 1);
    assert_eq!((view[0].0, view[0].1), (1, PRIORITY | END_STREAM));
    assert!(view[0].2 == big, "the fields differ");
}

#[test]
fn not_http2_passes_through_untouched() {
    for input in [
        &b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"PRI * HTTP/1.1\r\n",
        b"P",
        b"",
    ] {
        let mut fixer = Fixer::default();
        let mut out = Vec::new();
        fixer.feed(input, &mut out).unwrap();
        assert!(!fixer.is_http2());
        fixer.finish(&mut out);
        assert_eq!(out, input);
        // Cut short: still untouched.
        let (out, _) = run(&PREFACE[..10], 3);
        assert_eq!(out, &PREFACE[..10]);
    }
}

#[test]
fn a_stream_it_cannot_follow_passes_through_before_any_rewrite() {
    let mut bad_hpack = preface();
    // Index 70 is in no table.
    bad_hpack.extend(frame(HEADERS, END_HEADERS, 1, &[0x80 | 70]));
    bad_hpack.extend(frame(HEADERS, END_HEADERS, 3, b"garbage"));
    let mut stray = preface();
    stray.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
    stray.extend(frame(DATA, 0, 1, b"x"));
    let mut interleaved = preface();
    interleaved.extend(frame(HEADERS, 0, 1, &[0x82]));
    interleaved.extend(frame(DATA, 0, 1, b"x"));
    let mut bad_padding = preface();
    bad_padding.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82]));
    for input in [bad_hpack, stray, interleaved, bad_padding] {
        let (out, fixer) = run(&input, 2);
        assert_eq!(out, input);
        assert!(fixer.is_passthrough());
    }
}

#[test]
fn after_a_rewrite_a_broken_block_is_a_connection_error() {
    let mut enc = Encoder::new();
    let mut input = preface();
    let f = grpc_core_request("/a.B/C", "/x.sock");
    input.extend(frame(HEADERS, END_HEADERS, 1, &encode(&mut enc, &f)));
    input.extend(frame(HEADERS, END_HEADERS, 3, &[0x80 | 90]));
    let mut fixer = Fixer::default();
    let mut out = Vec::new();
    let err = fixer.feed(&input, &mut out).unwrap_err();
    assert!(err.to_string().contains("HPACK"), "{err}");
}

#[test]
fn random_input_never_panics() {
    // A small xorshift: deterministic, no dependency.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..2000 {
        let mut input = preface();
        let len = (next() % 300) as usize;
        for _ in 0..len {
            input.push(next() as u8);
        }
        // Now and then a plausible frame header.
        if next() % 2 == 0 {
            let body: Vec<u8> = (0..(next() % 40)).map(|_| next() as u8).collect();
            input.extend(frame(
                [HEADERS, CONTINUATION, DATA][(next() % 3) as usize],
                next() as u8,
                1,
                &body,
            ));
        }
        let mut fixer = Fixer::default();
        let mut out = Vec::new();
        for piece in input.chunks(1 + (next() % 64) as usize) {
            if fixer.feed(piece, &mut out).is_err() {
                break;
            }
        }
    }
}

#[tokio::test]
async fn the_adapter_rewrites_what_it_reads_and_writes_through() {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let mut fixed = AuthorityFixed::new(server);
    let mut enc = Encoder::new();
    let mut input = preface();
    let f = grpc_core_request(
        "/runtime.v1.RuntimeService/ListPodSandbox",
        "/run/crust.sock",
    );
    input.extend(frame(HEADERS, END_HEADERS, 1, &encode(&mut enc, &f)));
    input.extend(frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"));
    client.write_all(&input).await.unwrap();
    client.shutdown().await.unwrap();
    let mut out = Vec::new();
    fixed.read_to_end(&mut out).await.unwrap();
    assert_eq!(fixed.rewritten(), 1);
    let view = server_view(&out);
    assert_eq!(view[0].2[1].1, b"localhost");
    // The server's answer goes to the client untouched.
    fixed.write_all(b"answer").await.unwrap();
    let mut back = [0u8; 6];
    client.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"answer");
}
