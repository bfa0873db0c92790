//! Per-key async locks (one download or unpack per digest at a time) and
//! pins (content in use by an operation in flight, which GC must keep).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::OwnedMutexGuard;

/// One async mutex per key, created on demand and dropped with its last user.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    pub async fn lock(&self, key: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = lock_ignoring_poison(&self.locks);
            if map.len() > 1024 {
                map.retain(|_, w| w.strong_count() > 0);
            }
            match map.get(key).and_then(Weak::upgrade) {
                Some(l) => l,
                None => {
                    let l = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(key.to_string(), Arc::downgrade(&l));
                    l
                }
            }
        };
        lock.lock_owned().await
    }
}

/// Counted pins on keys; GC checks [`Pins::is_pinned`] under [`Pins::guard`]
/// so pinning and deleting never interleave.
#[derive(Default)]
pub struct Pins {
    counts: Mutex<HashMap<String, usize>>,
}

impl Pins {
    /// Pins `keys` until the returned set is dropped.
    pub fn pin(self: &Arc<Self>, keys: impl IntoIterator<Item = String>) -> PinSet {
        let mut set = PinSet {
            pins: self.clone(),
            keys: Vec::new(),
        };
        set.add(keys);
        set
    }

    pub fn guard(&self) -> PinGuard<'_> {
        PinGuard(lock_ignoring_poison(&self.counts))
    }
}

pub struct PinGuard<'a>(MutexGuard<'a, HashMap<String, usize>>);

impl PinGuard<'_> {
    pub fn is_pinned(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }
}

pub struct PinSet {
    pins: Arc<Pins>,
    keys: Vec<String>,
}

impl PinSet {
    pub fn add(&mut self, keys: impl IntoIterator<Item = String>) {
        let mut counts = lock_ignoring_poison(&self.pins.counts);
        for key in keys {
            *counts.entry(key.clone()).or_default() += 1;
            self.keys.push(key);
        }
    }
}

impl Drop for PinSet {
    fn drop(&mut self) {
        let mut counts = lock_ignoring_poison(&self.pins.counts);
        for key in self.keys.drain(..) {
            if let Some(n) = counts.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&key);
                }
            }
        }
    }
}

/// The maps hold plain counters, valid even if a holder panicked.
fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_count_and_release() {
        let pins = Arc::new(Pins::default());
        let a = pins.pin(["x".to_string()]);
        let mut b = pins.pin(["x".to_string()]);
        b.add(["y".to_string()]);
        assert!(pins.guard().is_pinned("x") && pins.guard().is_pinned("y"));
        drop(a);
        assert!(pins.guard().is_pinned("x"));
        drop(b);
        assert!(!pins.guard().is_pinned("x") && !pins.guard().is_pinned("y"));
    }

    #[tokio::test]
    async fn keyed_locks_serialise_one_key_only() {
        let locks = Arc::new(KeyedLocks::default());
        let a = locks.lock("a").await;
        // Another key is free.
        drop(locks.lock("b").await);
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock("a").await;
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(a);
        waiter.await.unwrap();
    }
}
