//! Offline image archives: OCI image layout, `docker save`.

use super::image::{TestImage, sha};

/// Builds an OCI image-layout tar of `img` named `name`.
pub fn oci_layout(img: &TestImage, name: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, path, data).unwrap();
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": img.manifest_type,
            "digest": img.manifest_digest(),
            "size": img.manifest.len(),
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": "latest",
            },
        }],
    });
    add("index.json", &serde_json::to_vec(&index).unwrap());
    for blob in img
        .layers
        .iter()
        .map(|l| &l.bytes)
        .chain([&img.config, &img.manifest])
    {
        add(&format!("blobs/sha256/{}", &sha(blob)[7..]), blob);
    }
    b.into_inner().unwrap()
}

/// Builds a classic `docker save` tar: uncompressed layers, manifest.json,
/// and a repeated layer stored as a symlink, as docker does.
pub fn docker_save(layers: &[Vec<u8>], tags: &[&str]) -> (Vec<u8>, String) {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"User": "www-data", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let config_name = format!("{}.json", &sha(&config)[7..]);
    let mut b = tar::Builder::new(Vec::new());
    let mut layer_paths = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let path = format!("layer{i}/layer.tar");
        if i > 0 && l == &layers[0] {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_cksum();
            b.append_link(&mut h, &path, "../layer0/layer.tar").unwrap();
        } else {
            let mut h = tar::Header::new_ustar();
            h.set_size(l.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, &path, l.as_slice()).unwrap();
        }
        layer_paths.push(path);
    }
    let mut h = tar::Header::new_ustar();
    h.set_size(config.len() as u64);
    h.set_cksum();
    b.append_data(&mut h, &config_name, config.as_slice())
        .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": config_name, "RepoTags": tags, "Layers": layer_paths}
    ]))
    .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_size(manifest.len() as u64);
    h.set_cksum();
    b.append_data(&mut h, "manifest.json", manifest.as_slice())
        .unwrap();
    (b.into_inner().unwrap(), sha(&config))
}
