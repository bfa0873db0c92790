//! The test NRI plugin as a program, started by the runtime as a
//! pre-installed plugin (`plugin_path`). It takes its name, index and
//! socket from NRI_PLUGIN_NAME, NRI_PLUGIN_IDX and NRI_PLUGIN_SOCKET (which
//! must be 0: crust passes the socket as standard input), and its behaviour
//! from its configuration drop-in (see `crust_nri::testing::FileConfig`).

use std::os::fd::AsFd;

use crust_nri::testing::{Behaviour, TestPlugin};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("nri-test-plugin: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let (name, index, socket) = (
        var("NRI_PLUGIN_NAME")?,
        var("NRI_PLUGIN_IDX")?,
        var("NRI_PLUGIN_SOCKET")?,
    );
    if socket != "0" {
        return Err(format!(
            "NRI_PLUGIN_SOCKET={socket}: only 0 (standard input) is supported"
        ));
    }
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| e.to_string())?;
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| e.to_string())?;
    let behaviour = Behaviour {
        from_config: true,
        ..Default::default()
    };
    let plugin = TestPlugin::start(stream, &name, &index, behaviour).await?;
    plugin.closed().await;
    Ok(())
}
