//! What the bench created on one endpoint and has not removed yet: the
//! cleanup at exit removes it whatever happened (an error, Ctrl-C,
//! SIGTERM).

use std::sync::Mutex;

#[derive(Default)]
pub struct Tracker {
    /// Pods created and not yet removed.
    pods: Mutex<Vec<String>>,
    /// Images the pull scenario pulled.
    images: Mutex<Vec<String>>,
}

impl Tracker {
    pub fn pod_created(&self, id: &str) {
        lock(&self.pods).push(id.to_string());
    }

    pub fn pod_removed(&self, id: &str) {
        lock(&self.pods).retain(|p| p != id);
    }

    pub fn image_pulled(&self, image_ref: String) {
        lock(&self.images).push(image_ref);
    }

    /// The pods still there, forgotten by the tracker.
    pub fn take_pods(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.pods))
    }

    /// The pulled images, forgotten by the tracker.
    pub fn take_images(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.images))
    }
}

/// The lists stay valid if a holder panicked: the cleanup still needs them.
fn lock(list: &Mutex<Vec<String>>) -> std::sync::MutexGuard<'_, Vec<String>> {
    list.lock().unwrap_or_else(|e| e.into_inner())
}
