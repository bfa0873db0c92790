//! The streaming server for exec, attach and port-forward URLs.
//!
//! Not built yet: the Exec, Attach and PortForward RPCs answer Unimplemented
//! until this crate serves their URLs.
