//! One registered plugin: its identity, subscription and connection.

use std::sync::Mutex;
use std::time::Duration;

use crate::api::{EventMask, PLUGIN_SERVICE};
use crate::wire::{CallError, Connection};

pub(crate) struct Plugin {
    /// Unique per connection (names may come back after a reconnect).
    pub id: u64,
    pub index: String,
    pub base: String,
    /// "NN-base", the name NRI uses in logs and conflict errors.
    pub name: String,
    pub events: EventMask,
    pub conn: Connection,
    pub pid: Option<i32>,
    /// The process, for plugins the runtime started itself.
    pub child: Mutex<Option<tokio::process::Child>>,
}

impl Plugin {
    pub fn external(&self) -> bool {
        self.child.lock().unwrap().is_none()
    }

    pub async fn call<Req, Resp>(
        &self,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        self.conn.call(PLUGIN_SERVICE, method, req, timeout).await
    }

    /// Disconnects the plugin and, if the runtime started it, kills it.
    pub fn stop(&self) {
        self.conn.close();
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.start_kill();
            // Reap it without holding anyone up.
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
        }
    }
}

/// Orders plugins as NRI calls them: by index, then by name.
pub(crate) fn invocation_order(a: &Plugin, b: &Plugin) -> std::cmp::Ordering {
    a.index
        .cmp(&b.index)
        .then_with(|| a.base.cmp(&b.base))
        .then(a.id.cmp(&b.id))
}
