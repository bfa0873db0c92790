//! Property tests of the SPDY/3.1 framing and header blocks, the bytes a
//! streaming client controls before any authentication beyond the token:
//! - frames round-trip (encode, then decode from the bytes cut anywhere);
//! - any bytes decode to frames or a clean error, never a panic, and a
//!   control frame over the limit is refused before it is buffered;
//! - header blocks round-trip through one zlib context per direction;
//! - any block decodes or fails cleanly, and one that inflates past the
//!   limit (a zlib bomb) is refused with bounded memory.
//!
//! Longer runs: `PROPTEST_CASES=100000 cargo test -p crust-streaming --test prop_spdy`.

use bytes::{Bytes, BytesMut};
use crust_quote::testing::config;
use crust_streaming::spdy::frame::{self, Setting, kind};
use crust_streaming::spdy::{Frame, FrameDecoder, HeaderDecoder, HeaderEncoder, HeaderError};
use proptest::prelude::*;

const MAX_CONTROL: usize = 4096;

fn stream_id() -> impl Strategy<Value = u32> {
    prop_oneof![1u32..16, 1u32..=frame::MAX_31_BIT]
}

fn block() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

/// Frames in their canonical form (what decode gives back): masked ids,
/// 3-bit priorities, known types only in their own variant.
fn frame() -> BoxedStrategy<Frame> {
    prop_oneof![
        (
            stream_id(),
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 1..300)
        )
            .prop_map(|(stream_id, flags, data)| Frame::Data {
                stream_id,
                flags,
                data: data.into()
            }),
        (
            stream_id(),
            0..=frame::MAX_31_BIT,
            0u8..8,
            any::<u8>(),
            any::<u8>(),
            block()
        )
            .prop_map(
                |(stream_id, associated_stream_id, priority, slot, flags, header_block)| {
                    Frame::SynStream {
                        stream_id,
                        associated_stream_id,
                        priority,
                        slot,
                        flags,
                        header_block,
                    }
                }
            ),
        (stream_id(), any::<u8>(), block()).prop_map(|(stream_id, flags, header_block)| {
            Frame::SynReply {
                stream_id,
                flags,
                header_block,
            }
        }),
        (stream_id(), any::<u32>())
            .prop_map(|(stream_id, status)| Frame::RstStream { stream_id, status }),
        (
            any::<u8>(),
            proptest::collection::vec((any::<u8>(), 0u32..1 << 24, any::<u32>()), 0..20)
        )
            .prop_map(|(flags, e)| Frame::Settings {
                flags,
                entries: e
                    .into_iter()
                    .map(|(flags, id, value)| Setting { flags, id, value })
                    .collect(),
            }),
        any::<u32>().prop_map(|id| Frame::Ping { id }),
        (0..=frame::MAX_31_BIT, any::<u32>()).prop_map(|(last_good_stream_id, status)| {
            Frame::GoAway {
                last_good_stream_id,
                status,
            }
        }),
        (stream_id(), any::<u8>(), block()).prop_map(|(stream_id, flags, header_block)| {
            Frame::Headers {
                stream_id,
                flags,
                header_block,
            }
        }),
        (0..=frame::MAX_31_BIT, 0..=frame::MAX_31_BIT)
            .prop_map(|(stream_id, delta)| Frame::WindowUpdate { stream_id, delta }),
        (
            any::<u16>().prop_filter("an unknown type", |t| !(1..=9).contains(t) || *t == 5),
            any::<u8>(),
            block()
        )
            .prop_map(|(frame_type, flags, payload)| Frame::Unknown {
                frame_type,
                flags,
                payload,
            }),
    ]
    .boxed()
}

/// Decodes `wire` fed in pieces of the given sizes.
fn decode_in_pieces(wire: &[u8], cuts: &[usize]) -> Result<Vec<Frame>, frame::FrameError> {
    let mut dec = FrameDecoder::new(MAX_CONTROL);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = wire;
    let mut cuts = cuts.iter().cycle();
    while !rest.is_empty() {
        let n = (*cuts.next().unwrap()).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        while let Some(f) = dec.decode(&mut buf)? {
            out.push(f);
        }
    }
    Ok(out)
}

/// DATA frames merged where the decoder may hand one out in pieces: a run
/// on one stream without FIN is one byte stream (pieces carry FIN on the
/// last only, and the other flags on all).
fn merge_data(frames: Vec<Frame>) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    for f in frames {
        if let (
            Frame::Data {
                stream_id,
                flags,
                data,
            },
            Some(Frame::Data {
                stream_id: last_id,
                flags: last_flags,
                data: last,
            }),
        ) = (&f, out.last_mut())
            && stream_id == last_id
            && *last_flags & frame::FLAG_FIN == 0
        {
            let mut merged = BytesMut::from(&last[..]);
            merged.extend_from_slice(data);
            *last = merged.freeze();
            *last_flags = *flags;
            continue;
        }
        out.push(f);
    }
    out
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn frames_round_trip_cut_anywhere(
        frames in proptest::collection::vec(frame(), 1..12),
        cuts in proptest::collection::vec(1usize..64, 1..8),
    ) {
        let mut wire = BytesMut::new();
        for f in &frames {
            f.encode(&mut wire);
        }
        let got = decode_in_pieces(&wire, &cuts).unwrap();
        prop_assert_eq!(merge_data(got), merge_data(frames));
    }

    #[test]
    fn any_bytes_decode_or_fail_cleanly(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        control_head in proptest::option::of((0u16..12, 0u32..1 << 24)),
    ) {
        let mut bytes = bytes;
        // Half the cases start with a plausible control frame header, so
        // the per-type parsers see bogus lengths and counts.
        if let Some((t, len)) = control_head
            && bytes.len() >= 8
        {
            bytes[..4].copy_from_slice(&[0x80, 3, (t >> 8) as u8, t as u8]);
            bytes[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
        }
        let mut dec = FrameDecoder::new(MAX_CONTROL);
        let mut buf = BytesMut::from(&bytes[..]);
        loop {
            let before = buf.len();
            match dec.decode(&mut buf) {
                Ok(Some(_)) => prop_assert!(buf.len() < before || before == 0 || buf.len() <= before),
                Ok(None) => {
                    // Waiting for more: never for more than one frame's worth.
                    prop_assert!(buf.capacity() <= bytes.len().max(8) + MAX_CONTROL + 8);
                    break;
                }
                Err(e) => {
                    prop_assert!(e.to_string().len() < 200);
                    break;
                }
            }
        }
    }

    #[test]
    fn settings_counts_never_outrun_the_frame(count in any::<u32>(), len in 4usize..64) {
        let mut wire = vec![0x80, 3, 0, kind::SETTINGS as u8, 0, 0, 0, len as u8];
        wire.extend_from_slice(&count.to_be_bytes());
        wire.resize(8 + len, 0);
        let mut buf = BytesMut::from(&wire[..]);
        match FrameDecoder::new(MAX_CONTROL).decode(&mut buf) {
            Ok(Some(Frame::Settings { entries, .. })) => {
                prop_assert_eq!(entries.len() * 8 + 4, len);
            }
            Ok(other) => prop_assert!(false, "{:?}", other),
            Err(_) => {}
        }
    }
}

fn header_list() -> BoxedStrategy<Vec<(String, String)>> {
    proptest::collection::btree_map(
        "[a-z:-]{1,16}",
        prop_oneof![
            "[ -~]{0,40}",
            any::<String>(),
            (0usize..2000).prop_map(|n| "v".repeat(n)),
        ],
        0..12,
    )
    .prop_map(|m| m.into_iter().collect())
    .boxed()
}

proptest! {
    #![proptest_config(config(512))]

    /// Blocks compress against the earlier ones of the session: decoding
    /// needs every earlier block, in order, and gives back every list.
    #[test]
    fn header_blocks_round_trip_in_one_context(lists in proptest::collection::vec(header_list(), 1..8)) {
        let mut enc = HeaderEncoder::new();
        let mut dec = HeaderDecoder::new(1 << 20);
        for list in &lists {
            let pairs: Vec<(&str, &str)> = list.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let mut block = Vec::new();
            enc.encode(&pairs, &mut block);
            let got = dec.decode(&block).unwrap();
            prop_assert_eq!(&got, list);
        }
    }

    /// Random blocks, and valid streams with bytes flipped: a value or a
    /// clean error, never a panic, and a session error stays one.
    #[test]
    fn any_block_decodes_or_fails_cleanly(
        lists in proptest::collection::vec(header_list(), 1..4),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        raw in proptest::collection::vec(any::<u8>(), 0..256),
        use_raw in any::<bool>(),
    ) {
        let mut dec = HeaderDecoder::new(4096);
        let mut blocks = Vec::new();
        if use_raw {
            blocks.push(raw);
        } else {
            let mut enc = HeaderEncoder::new();
            for list in &lists {
                let pairs: Vec<(&str, &str)> = list.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                let mut block = Vec::new();
                enc.encode(&pairs, &mut block);
                blocks.push(block);
            }
            for (i, b) in flips {
                let last = blocks.last_mut().unwrap();
                let i = i.index(last.len());
                last[i] = b;
            }
        }
        for b in &blocks {
            match dec.decode(b) {
                Ok(h) => {
                    // The wire size the pairs took at least: a byte that is
                    // not UTF-8 comes back as U+FFFD (3 bytes), so that
                    // counts 1 (a real U+FFFD is then under-counted, which
                    // keeps the bound sound).
                    let wire = |s: &str| -> usize {
                        s.chars().map(|c| if c == '\u{FFFD}' { 1 } else { c.len_utf8() }).sum()
                    };
                    let size: usize = h.iter().map(|(n, v)| wire(n) + wire(v) + 8).sum();
                    prop_assert!(size <= 4096 + 4);
                }
                Err(e) => {
                    prop_assert!(e.to_string().len() < 300, "{}", e);
                    if e.is_session_error() {
                        break;
                    }
                }
            }
        }
    }

}

proptest! {
    // Each case deflates megabytes (slow in a debug build): few cases.
    #![proptest_config(config(12))]

    /// A zlib bomb: a short block that inflates to megabytes is refused as
    /// soon as it passes the limit.
    #[test]
    fn zlib_bombs_are_refused(mb in 1usize..3, limit in 1024usize..65536) {
        let value = "a".repeat(mb << 20);
        let mut block = Vec::new();
        HeaderEncoder::new().encode(&[("x", &value)], &mut block);
        prop_assert!(block.len() < (mb << 20) / 100);
        let err = HeaderDecoder::new(limit).decode(&block).unwrap_err();
        prop_assert_eq!(err, HeaderError::TooLarge(limit));
    }
}
