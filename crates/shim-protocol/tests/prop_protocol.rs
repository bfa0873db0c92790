//! Property tests of the monitor's control protocol as the monitor reads
//! it: length-prefixed messages and attach frames arriving in arbitrary
//! pieces, and the JSON requests inside them. Whatever arrives, decoding
//! gives whole items, "incomplete" or a clean error, never a panic and
//! never an allocation over the announced limits; what the daemon encodes
//! comes out the same however the stream is cut. Case counts: see
//! `crust_quote::testing::cases` (PROPTEST_CASES overrides).

use crust_quote::testing::{config, hostile_string};
use crust_shim_protocol::frame::{
    DecodeError, encode_frame, encode_message, read_frame, read_message, take_frame, take_message,
};
use crust_shim_protocol::messages::{ExecRequest, MAX_FRAME, MAX_MESSAGE, Request, valid_exec_id};
use proptest::prelude::*;

/// What feeding a stream gave: the items, how it ended, what is left over.
type Fed<T> = (Vec<T>, Result<(), DecodeError>, Vec<u8>);

/// Cuts `wire` at `cuts` (positions modulo its length) and feeds the pieces
/// one by one to `take`, collecting what it yields.
fn feed<T>(
    wire: &[u8],
    cuts: &[usize],
    mut take: impl FnMut(&mut Vec<u8>) -> Result<Option<T>, DecodeError>,
) -> Fed<T> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    points.push(wire.len());
    points.sort_unstable();
    let (mut buf, mut got, mut from) = (Vec::new(), Vec::new(), 0);
    for to in points {
        buf.extend_from_slice(&wire[from..to]);
        from = to;
        loop {
            match take(&mut buf) {
                Ok(Some(item)) => got.push(item),
                Ok(None) => break,
                Err(e) => return (got, Err(e), buf),
            }
        }
    }
    (got, Ok(()), buf)
}

fn exec_request() -> BoxedStrategy<ExecRequest> {
    (
        hostile_string(),
        prop::collection::vec(hostile_string(), 0..4),
        prop::collection::vec(hostile_string(), 0..3),
        proptest::option::of(hostile_string()),
        any::<(bool, bool)>(),
        proptest::option::of(any::<(u16, u16)>()),
        any::<u64>(),
    )
        .prop_map(
            |(exec_id, args, env, cwd, (tty, stdin), console_size, timeout_ms)| ExecRequest {
                exec_id,
                args,
                env,
                cwd,
                tty,
                stdin,
                console_size,
                process: None,
                timeout_ms,
            },
        )
        .boxed()
}

fn request() -> BoxedStrategy<Request> {
    prop_oneof![
        Just(Request::Start),
        any::<(i32, bool)>().prop_map(|(signal, all)| Request::Kill { signal, all }),
        Just(Request::ReopenLog),
        exec_request().prop_map(Request::ExecSync),
        exec_request().prop_map(Request::Exec),
        Just(Request::State),
        any::<(u16, u16)>().prop_map(|(width, height)| Request::Resize { width, height }),
        Just(Request::Wait),
        hostile_string().prop_map(|s| Request::Update {
            resources: serde_json::json!({ "unified": { s: "1" } })
        }),
    ]
    .boxed()
}

/// Bytes a broken or hostile peer might send: random, or a header that
/// announces a length around the limit followed by a little data.
fn hostile_wire(limit: usize, header: usize) -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        (
            prop::collection::vec(any::<u8>(), header - 4..=header - 4),
            prop_oneof![
                Just(limit as u32),
                Just(limit as u32 + 1),
                Just(u32::MAX),
                any::<u32>()
            ],
            prop::collection::vec(any::<u8>(), 0..256),
        )
            .prop_map(|(prefix, len, rest)| {
                let mut w = prefix;
                w.extend_from_slice(&len.to_be_bytes());
                w.extend_from_slice(&rest);
                w
            }),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(config(256))]

    /// Requests the daemon encodes reach the monitor intact, however the
    /// socket cuts the stream.
    #[test]
    fn requests_survive_any_cutting(
        reqs in prop::collection::vec(request(), 1..6),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut wire = Vec::new();
        for r in &reqs {
            encode_message(&mut wire, &serde_json::to_vec(r).unwrap());
        }
        let (bodies, end, rest) = feed(&wire, &cuts, take_message);
        prop_assert_eq!(end, Ok(()));
        prop_assert!(rest.is_empty());
        let decoded: Vec<Request> = bodies
            .iter()
            .map(|b| serde_json::from_slice(b).unwrap())
            .collect();
        prop_assert_eq!(&decoded, &reqs);
        // The blocking reader agrees.
        let mut r = &wire[..];
        let mut blocking = Vec::new();
        while let Some(body) = read_message(&mut r).unwrap() {
            blocking.push(serde_json::from_slice::<Request>(&body).unwrap());
        }
        prop_assert_eq!(blocking, reqs);
    }

    /// Attach frames likewise, for every stream number.
    #[test]
    fn frames_survive_any_cutting(
        frames in prop::collection::vec((any::<u8>(), prop::collection::vec(any::<u8>(), 0..300)), 1..6),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut wire = Vec::new();
        for (s, p) in &frames {
            encode_frame(&mut wire, *s, p);
        }
        let (got, end, rest) = feed(&wire, &cuts, take_frame);
        prop_assert_eq!(end, Ok(()));
        prop_assert!(rest.is_empty());
        prop_assert_eq!(&got, &frames);
        let mut r = &wire[..];
        let mut blocking = Vec::new();
        while let Some(f) = read_frame(&mut r).unwrap() {
            blocking.push(f);
        }
        prop_assert_eq!(blocking, frames);
    }

    /// Arbitrary bytes as messages: whole bodies within the limit,
    /// "incomplete", or TooLarge for an announced length over the limit;
    /// nothing is consumed that was not yielded.
    #[test]
    fn hostile_message_streams_decode_cleanly(
        wire in hostile_wire(MAX_MESSAGE, 4),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let (bodies, end, rest) = feed(&wire, &cuts, take_message);
        let consumed: usize = bodies.iter().map(|b| 4 + b.len()).sum();
        prop_assert!(bodies.iter().all(|b| b.len() <= MAX_MESSAGE));
        match end {
            // All of it fed: what was not yielded is still buffered.
            Ok(()) => prop_assert_eq!(consumed + rest.len(), wire.len()),
            Err(DecodeError::TooLarge(n)) => {
                prop_assert!(n > MAX_MESSAGE);
                prop_assert!(consumed + rest.len() <= wire.len());
            }
        }
        // The blocking reader refuses before allocating the announced size.
        let mut r = &wire[..];
        while let Ok(Some(body)) = read_message(&mut r) {
            prop_assert!(body.len() <= MAX_MESSAGE);
        }
        // Whatever the body, the request decoder answers, never panics.
        for b in &bodies {
            let _ = serde_json::from_slice::<Request>(b);
        }
    }

    #[test]
    fn hostile_frame_streams_decode_cleanly(
        wire in hostile_wire(MAX_FRAME, 5),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let (got, end, rest) = feed(&wire, &cuts, take_frame);
        let consumed: usize = got.iter().map(|(_, p)| 5 + p.len()).sum();
        prop_assert!(got.iter().all(|(_, p)| p.len() <= MAX_FRAME));
        match end {
            Ok(()) => prop_assert_eq!(consumed + rest.len(), wire.len()),
            Err(DecodeError::TooLarge(n)) => {
                prop_assert!(n > MAX_FRAME);
                prop_assert!(consumed + rest.len() <= wire.len());
            }
        }
        let mut r = &wire[..];
        while let Ok(Some((_, p))) = read_frame(&mut r) {
            prop_assert!(p.len() <= MAX_FRAME);
        }
    }

    /// JSON that is almost a request (a real one with bytes changed or cut
    /// short) is decoded or refused, never a panic.
    #[test]
    fn mangled_requests_never_panic(
        req in request(),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
    ) {
        let mut body = serde_json::to_vec(&req).unwrap();
        for (at, b) in flips {
            let n = body.len();
            body[at % n] = b;
        }
        body.truncate(cut % (body.len() + 1));
        let _ = serde_json::from_slice::<Request>(&body);
    }

    /// An exec id names a directory under the container's state dir: only
    /// ids that cannot leave it are valid.
    #[test]
    fn exec_ids_cannot_name_a_path(id in hostile_string()) {
        if valid_exec_id(&id) {
            prop_assert!(!id.contains('/') && !id.contains('\0'));
            prop_assert!(id != "." && id != "..");
            prop_assert!(!id.is_empty() && id.len() <= 64);
        }
    }
}

#[test]
fn a_header_over_the_limit_is_refused_at_once() {
    // 4 GiB announced: refused from the header alone.
    let wire = u32::MAX.to_be_bytes().to_vec();
    assert!(matches!(
        take_message(&mut wire.clone()),
        Err(DecodeError::TooLarge(_))
    ));
    assert!(read_message(&mut &wire[..]).is_err());
}
