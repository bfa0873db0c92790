//! What a container reports of its image, decided once at creation.
//!
//! kubelet creates containers with the image ID in `ImageSpec.image` and the
//! pod's image, as its user wrote it, in `user_specified_image`, and shows
//! `ContainerStatus.image.image` as the pod's `containerStatuses[].image`
//! and `image_ref` as its `imageID`. So a container reports the name the
//! user gave, the repo digest of the image it runs as `image_ref` (as
//! containerd and CRI-O do) and the ID as `image_id`. Both are fixed when
//! the container is created: after a restart, and after the tag moved on to
//! another image, it still runs what it was created from.

use crust_image::Reference;
use serde::{Deserialize, Serialize};

use crate::images::ImageFacts;

/// A container's image as ContainerStatus and ListContainers report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedImage {
    /// `image.image` and `image.user_specified_image`.
    pub name: String,
    /// `image_ref`: `repo@sha256:<manifest digest>`, or the image ID when
    /// the image has no repo digest.
    pub image_ref: String,
}

/// The name and digest a container of `image` reports, created with
/// `requested` in `ImageSpec.image` and `user_specified` in
/// `ImageSpec.user_specified_image`.
///
/// The name: `user_specified` (kubelet); else `requested` when it is a
/// name (crictl); else, for a request by ID, the image's first tag, as
/// containerd and CRI-O report it; else the ID as requested.
pub fn reported(requested: &str, user_specified: &str, image: &ImageFacts) -> ReportedImage {
    let name = if !user_specified.is_empty() {
        user_specified
    } else if !image.by_id {
        requested
    } else {
        image.repo_tags.first().map_or(requested, String::as_str)
    };
    ReportedImage {
        name: name.to_string(),
        image_ref: repo_digest(name, &image.repo_digests)
            .unwrap_or(&image.id)
            .to_string(),
    }
}

/// The repo digest that goes with `name`: the one `name` itself pins,
/// else the first of `name`'s repository, else the first of all (an image
/// pulled from one repository and run by a tag of another); None when there
/// are none.
pub fn repo_digest<'a>(name: &str, digests: &'a [String]) -> Option<&'a String> {
    let wanted = Reference::parse(name).ok().map(|r| {
        let pinned = r.digest().map(|d| r.repo_digest(d));
        (r.name(), pinned)
    });
    if let Some((repo, pinned)) = wanted {
        if let Some(p) = pinned
            && let Some(d) = digests.iter().find(|d| **d == p)
        {
            return Some(d);
        }
        if let Some(d) = digests
            .iter()
            .find(|d| d.split_once('@').is_some_and(|(r, _)| r == repo))
        {
            return Some(d);
        }
    }
    digests.first()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sha256:c51e5fa9d87bc0a9d87b8c3cdb6a50e2ca40e3f03faa8e4bb8cf37f4a6ff4bde";

    fn digest(repo: &str, n: u8) -> String {
        format!("{repo}@sha256:{}", hex::encode([n; 32]))
    }

    fn image(tags: &[&str], digests: &[&str], by_id: bool) -> ImageFacts {
        ImageFacts {
            id: ID.into(),
            config: Default::default(),
            repo_tags: tags.iter().map(|t| t.to_string()).collect(),
            repo_digests: digests.iter().map(|d| d.to_string()).collect(),
            by_id,
        }
    }

    const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox";

    #[test]
    fn kubelet_gets_the_users_name_and_the_repo_digest() {
        let d = digest(BUSYBOX, 1);
        let img = image(&[&format!("{BUSYBOX}:1.37.0-1")], &[&d], true);
        let r = reported(ID, &format!("{BUSYBOX}:1.37.0-1"), &img);
        assert_eq!(r.name, format!("{BUSYBOX}:1.37.0-1"));
        assert_eq!(r.image_ref, d);
    }

    #[test]
    fn the_users_name_is_kept_as_written() {
        let d = digest("docker.io/library/busybox", 1);
        let img = image(&["docker.io/library/busybox:latest"], &[&d], true);
        let r = reported(ID, "busybox", &img);
        assert_eq!(
            (r.name.as_str(), r.image_ref.as_str()),
            ("busybox", d.as_str())
        );
    }

    #[test]
    fn a_name_in_image_without_user_specified_is_the_name() {
        let d = digest("docker.io/library/busybox", 1);
        let img = image(&["docker.io/library/busybox:latest"], &[&d], false);
        let r = reported("busybox:latest", "", &img);
        assert_eq!(
            (r.name.as_str(), r.image_ref.as_str()),
            ("busybox:latest", d.as_str())
        );
    }

    #[test]
    fn an_id_alone_reports_the_first_tag_else_the_id() {
        let d = digest(BUSYBOX, 1);
        let tagged = image(&[&format!("{BUSYBOX}:1"), "other/x:2"], &[&d], true);
        let r = reported(ID, "", &tagged);
        assert_eq!((r.name, r.image_ref), (format!("{BUSYBOX}:1"), d));
        // An image by ID prefix with no reference at all (its tag moved
        // on): the ID as asked, and the ID as image_ref.
        let bare = image(&[], &[], true);
        let r = reported("c51e5f", "", &bare);
        assert_eq!((r.name.as_str(), r.image_ref.as_str()), ("c51e5f", ID));
    }

    #[test]
    fn the_digest_of_the_users_repository_wins() {
        let mirror = digest("mirror.example/busybox", 1);
        let ours = digest(BUSYBOX, 1);
        let digests = [mirror.clone(), ours.clone()];
        assert_eq!(
            repo_digest(&format!("{BUSYBOX}:1.37.0-1"), &digests),
            Some(&ours)
        );
        // Another repository: the first one.
        assert_eq!(repo_digest("quay.io/x/y:1", &digests), Some(&mirror));
        // Normalised as references are: `busybox` is docker.io/library/busybox.
        let hub = digest("docker.io/library/busybox", 2);
        assert_eq!(
            repo_digest("busybox", &[mirror.clone(), hub.clone()]),
            Some(&hub)
        );
        assert_eq!(repo_digest("busybox", &[]), None);
    }

    #[test]
    fn a_name_by_digest_reports_that_digest() {
        let index = digest(BUSYBOX, 1);
        let platform = digest(BUSYBOX, 2);
        let digests = [index.clone(), platform.clone()];
        assert_eq!(repo_digest(&platform, &digests), Some(&platform));
        // A digest the image does not hold: its repository's first.
        assert_eq!(repo_digest(&digest(BUSYBOX, 3), &digests), Some(&index));
    }

    #[test]
    fn names_that_are_no_references_fall_back_to_the_first_digest() {
        let d = digest(BUSYBOX, 1);
        for name in ["", "Not A Ref!", ID, "UPPER/case", &"a".repeat(300)] {
            assert_eq!(
                repo_digest(name, std::slice::from_ref(&d)),
                Some(&d),
                "{name}"
            );
        }
        // A stored digest without '@' (never written by crust) is skipped
        // by the repository match, not a panic.
        let odd = ["odd".to_string(), d.clone()];
        assert_eq!(repo_digest(BUSYBOX, &odd), Some(&d));
    }
}
