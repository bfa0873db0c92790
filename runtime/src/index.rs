//! The in-memory index of pod sandboxes or of containers: records by full
//! ID, found by ID or unique ID prefix (as crictl sends them), and the names
//! they hold ((name, namespace, uid, attempt) for pods, (pod, name, attempt)
//! for containers), reserved from the moment a create starts.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::OwnedMutexGuard;

/// One pod or container: its current record, and the lock that serializes
/// its life-cycle steps (start, update, stop, remove).
pub struct Entry<R> {
    /// Shared, so listing clones a pointer, not the record.
    record: Mutex<Arc<R>>,
    /// Held by an [`Op`]; true once the entry is removed.
    op: Arc<tokio::sync::Mutex<bool>>,
}

impl<R: Clone> Entry<R> {
    pub fn new(record: R) -> Arc<Entry<R>> {
        Arc::new(Entry {
            record: Mutex::new(Arc::new(record)),
            op: Arc::new(tokio::sync::Mutex::new(false)),
        })
    }

    /// The current record, without copying it.
    pub fn view(&self) -> Arc<R> {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A copy of the current record, to change and [`Entry::set`].
    pub fn snapshot(&self) -> R {
        R::clone(&self.view())
    }

    pub fn set(&self, record: R) {
        *self.record.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(record);
    }

    /// The exclusive right to change this entry's life cycle, if no one
    /// holds it now.
    /// Whether a life-cycle step holds the entry now (`crust check` does
    /// not take a record for an orphan while a step is changing it).
    pub fn is_busy(&self) -> bool {
        self.op.try_lock().is_err()
    }

    pub fn try_lock(self: &Arc<Self>) -> Option<Op<R>> {
        Some(Op {
            entry: self.clone(),
            removed: self.op.clone().try_lock_owned().ok()?,
        })
    }

    /// Waits for the exclusive right to change this entry's life cycle.
    pub async fn lock(self: &Arc<Self>) -> Op<R> {
        Op {
            entry: self.clone(),
            removed: self.op.clone().lock_owned().await,
        }
    }
}

/// The exclusive right to change one entry's life cycle, held for a whole
/// step (e.g. StopPodSandbox, from its containers to its network).
pub struct Op<R> {
    entry: Arc<Entry<R>>,
    removed: OwnedMutexGuard<bool>,
}

impl<R: Clone> Op<R> {
    pub fn entry(&self) -> &Arc<Entry<R>> {
        &self.entry
    }

    /// Whether an earlier step removed the entry (then there is nothing
    /// left to do).
    pub fn is_removed(&self) -> bool {
        *self.removed
    }

    pub fn mark_removed(&mut self) {
        *self.removed = true;
    }
}

/// Why a name cannot be reserved.
#[derive(Debug)]
pub enum ReserveError<E> {
    /// Another pod or container (this ID) holds the name.
    Taken(String),
    /// Making a new ID failed.
    NewId(E),
}

/// A full ID or prefix that matches more than one entry.
#[derive(Debug)]
pub struct Ambiguous;

/// Records by ID and the names they hold. `K` is the name key.
pub struct Index<R, K> {
    inner: Mutex<Inner<R, K>>,
}

struct Inner<R, K> {
    /// Entries clients can see.
    by_id: HashMap<String, Arc<Entry<R>>>,
    /// Held names, including those of entries still being created.
    names: HashMap<K, String>,
}

impl<R: Clone, K: Hash + Eq + Clone> Default for Index<R, K> {
    fn default() -> Self {
        Index {
            inner: Mutex::new(Inner {
                by_id: HashMap::new(),
                names: HashMap::new(),
            }),
        }
    }
}

impl<R: Clone, K: Hash + Eq + Clone> Index<R, K> {
    fn inner(&self) -> MutexGuard<'_, Inner<R, K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry of a full ID, or of the one ID that starts with `id`.
    /// Callers reject an empty `id` first (it is a prefix of every ID).
    pub fn resolve(&self, id: &str) -> Result<Option<Arc<Entry<R>>>, Ambiguous> {
        let inner = self.inner();
        if let Some(e) = inner.by_id.get(id) {
            return Ok(Some(e.clone()));
        }
        let mut found = inner.by_id.iter().filter(|(k, _)| k.starts_with(id));
        match (found.next(), found.next()) {
            (Some((_, e)), None) => Ok(Some(e.clone())),
            (Some(_), Some(_)) => Err(Ambiguous),
            _ => Ok(None),
        }
    }

    /// Reserves `name` for a new ID from `new_id` that no entry or
    /// reservation has, and returns that ID.
    pub fn reserve<E>(
        &self,
        name: K,
        mut new_id: impl FnMut() -> Result<String, E>,
    ) -> Result<String, ReserveError<E>> {
        let mut inner = self.inner();
        if let Some(owner) = inner.names.get(&name) {
            return Err(ReserveError::Taken(owner.clone()));
        }
        let id = loop {
            let id = new_id().map_err(ReserveError::NewId)?;
            if !inner.by_id.contains_key(&id) && !inner.names.values().any(|v| *v == id) {
                break id;
            }
        };
        inner.names.insert(name, id.clone());
        Ok(id)
    }

    /// Frees a name whose create failed (and left nothing visible).
    pub fn release(&self, name: &K) {
        self.inner().names.remove(name);
    }

    /// Makes a record visible under its ID and name.
    pub fn publish(&self, id: &str, name: K, record: R) -> Arc<Entry<R>> {
        let entry = Entry::new(record);
        let mut inner = self.inner();
        inner.names.insert(name, id.to_string());
        inner.by_id.insert(id.to_string(), entry.clone());
        entry
    }

    /// Removes an entry and frees its name.
    pub fn unpublish(&self, id: &str, name: &K) {
        let mut inner = self.inner();
        inner.by_id.remove(id);
        inner.names.remove(name);
    }

    /// Every visible entry, in no order.
    pub fn entries(&self) -> Vec<Arc<Entry<R>>> {
        self.inner().by_id.values().cloned().collect()
    }

    /// Every visible ID.
    pub fn ids(&self) -> HashSet<String> {
        self.inner().by_id.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> impl FnMut() -> Result<String, ()> {
        let mut list: Vec<String> = list.iter().rev().map(|s| s.to_string()).collect();
        move || list.pop().ok_or(())
    }

    #[test]
    fn full_ids_and_unique_prefixes_resolve() {
        let index: Index<u32, &str> = Index::default();
        index.publish("abc1", "one", 1);
        index.publish("abd2", "two", 2);
        assert_eq!(*index.resolve("abc1").unwrap().unwrap().view(), 1);
        assert_eq!(*index.resolve("abd").unwrap().unwrap().view(), 2);
        assert!(index.resolve("ab").is_err(), "ambiguous prefix");
        assert!(index.resolve("x").unwrap().is_none());
        // A full ID wins over being a prefix of another.
        index.publish("abc", "three", 3);
        assert_eq!(*index.resolve("abc").unwrap().unwrap().view(), 3);
    }

    #[test]
    fn a_name_is_held_from_reservation_until_removal() {
        let index: Index<u32, &str> = Index::default();
        let id = index.reserve("web", ids(&["a1"])).unwrap();
        assert_eq!(id, "a1");
        match index.reserve("web", ids(&["b2"])) {
            Err(ReserveError::Taken(owner)) => assert_eq!(owner, "a1"),
            other => panic!("{other:?}"),
        }
        // Reserved but not published: not visible.
        assert!(index.resolve("a1").unwrap().is_none());
        index.publish(&id, "web", 7);
        assert!(matches!(
            index.reserve("web", ids(&["c3"])),
            Err(ReserveError::Taken(_))
        ));
        index.unpublish(&id, &"web");
        assert!(index.resolve("a1").unwrap().is_none());
        assert_eq!(index.reserve("web", ids(&["d4"])).unwrap(), "d4");
        index.release(&"web");
        assert_eq!(index.reserve("web", ids(&["e5"])).unwrap(), "e5");
    }

    #[test]
    fn new_ids_skip_ones_in_use_or_reserved() {
        let index: Index<u32, &str> = Index::default();
        index.publish("x", "one", 1);
        index.reserve("two", ids(&["y"])).unwrap();
        let id = index.reserve("three", ids(&["x", "y", "z"])).unwrap();
        assert_eq!(id, "z");
        assert!(matches!(
            index.reserve("four", ids(&[])),
            Err(ReserveError::NewId(()))
        ));
    }

    #[tokio::test]
    async fn ops_serialize_and_remember_removal() {
        let entry = Entry::new(1u32);
        let mut op = entry.lock().await;
        assert!(!op.is_removed());
        let waiting = {
            let entry = entry.clone();
            tokio::spawn(async move { entry.lock().await.is_removed() })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a second op waits for the first");
        op.mark_removed();
        drop(op);
        assert!(waiting.await.unwrap(), "the next op sees the removal");
    }
}
