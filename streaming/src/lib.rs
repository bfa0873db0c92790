//! The streaming server for exec, attach and port-forward URLs.
//!
//! The daemon's Exec, Attach and PortForward RPCs check the container or
//! pod, then ask [`StreamingServer`] for a single-use URL
//! (`http://127.0.0.1:<port>/<exec|attach|portforward>/<token>`). The
//! client (kubelet's proxy, crictl, critest) upgrades that URL to
//!
//! - SPDY/3.1 (`Upgrade: SPDY/3.1`) with the `v4.channel.k8s.io`,
//!   `v3.channel.k8s.io`, `v2.channel.k8s.io` or `channel.k8s.io`
//!   remotecommand protocols, or `portforward.k8s.io`;
//! - WebSocket with `v5.channel.k8s.io`, `v4.channel.k8s.io`,
//!   `v4.base64.channel.k8s.io`, `channel.k8s.io`, `base64.channel.k8s.io`
//!   for exec and attach; for port-forward `SPDY/3.1+portforward.k8s.io`
//!   (SPDY tunnelled in WebSocket messages, what client-go ≥ 1.30 and
//!   crictl use) or the channel protocols with `?port=`.
//!
//! The work is done by a [`Backend`] the daemon implements; port-forward's
//! real forwarding into a pod's network namespace is [`forward_in_netns`].

mod backend;
mod config;
mod error;
mod portforward;
mod remotecommand;
mod server;
pub mod spdy;
mod status;
mod tls;
mod token;
mod ws;

pub use backend::{
    AttachRequest, Backend, BackendError, BoxDuplex, BoxFuture, BoxRead, BoxWrite, Duplex,
    ExecRequest, PortForwardRequest, StreamIo, TerminalSize,
};
pub use config::{StreamingConfig, TlsConfig};
pub use error::Error;
pub use portforward::{connect_in_netns, forward_in_netns, pipe};
pub use server::StreamingServer;
