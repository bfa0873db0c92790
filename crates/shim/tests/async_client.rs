//! The tokio client against a real monitor (feature `client-async`).
#![cfg(feature = "client-async")]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use crust_shim::async_client::AsyncShim;
use crust_shim::client::AttachEvent;
use crust_shim::{ExecRequest, SpawnOptions, Status};

async fn drive(rt: Rt) {
    let f = Fixture::new(rt, "async", &["cat"], false);
    let cfg = f.config(false, true, true);
    let shim = AsyncShim::spawn(SpawnOptions {
        shim_binary: PathBuf::from(env!("CARGO_BIN_EXE_crust-shim")),
        state_dir: f.state_dir.clone(),
        config: cfg,
        timeout: Duration::from_secs(60),
    })
    .await
    .unwrap();
    assert_eq!(shim.state().await.unwrap().status, Status::Created);
    // Many waiters cost no threads.
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let s = shim.clone();
            tokio::spawn(async move { s.wait().await })
        })
        .collect();
    shim.start().await.unwrap();
    let o = shim
        .exec_sync(&ExecRequest {
            args: vec!["sh".into(), "-c".into(), "echo hi; exit 4".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((o.exit_code, &o.stdout[..]), (4, &b"hi\n"[..]));
    let (mut r, mut w) = shim.attach().await.unwrap();
    w.write_stdin(b"async\n").await.unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"async\n") {
        match r.next_event().await.unwrap() {
            Some(AttachEvent::Stdout(d)) => got.extend_from_slice(&d),
            other => panic!("unexpected {other:?}"),
        }
    }
    w.close_stdin().await.unwrap();
    for h in waiters {
        assert_eq!(h.await.unwrap().unwrap().exit_code, 0);
    }
    // After the exit: from the file.
    assert_eq!(shim.wait().await.unwrap().exit_code, 0);
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_client_embedded() {
    if can_run(Rt::Embedded) {
        drive(Rt::Embedded).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_client_runc() {
    if can_run(Rt::Runc) {
        drive(Rt::Runc).await
    }
}
