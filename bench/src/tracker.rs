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

#[cfg(test)]
mod tests {
    use super::Tracker;

    #[test]
    fn a_removed_pod_is_not_cleaned_up_again() {
        let t = Tracker::default();
        t.pod_created("a");
        t.pod_created("b");
        t.pod_removed("a");
        assert_eq!(t.take_pods(), ["b"]);
        assert!(t.take_pods().is_empty(), "taken pods are forgotten");
    }

    #[test]
    fn pulled_images_are_taken_once() {
        let t = Tracker::default();
        t.image_pulled("sha256:1".into());
        assert_eq!(t.take_images(), ["sha256:1"]);
        assert!(t.take_images().is_empty());
    }
}
