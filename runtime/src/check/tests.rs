//! The check against a fake node (no root needed): what it lists, the
//! order repairs go in, what a repair refuses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::*;
use crust_image::OrphanContent;

/// A node in memory that records what is done to it.
#[derive(Default)]
struct FakeNode {
    /// Dir path -> names in it.
    dirs: Mutex<BTreeMap<PathBuf, Vec<String>>>,
    mounts: Mutex<Vec<PathBuf>>,
    monitors: Mutex<Vec<(i32, PathBuf)>>,
    cgroups: Mutex<BTreeMap<String, Vec<String>>>,
    bundles: BTreeMap<PathBuf, String>,
    done: Mutex<Vec<String>>,
}

impl FakeNode {
    /// `dir` and its ancestors.
    fn add_dir(&self, dir: &Path) {
        let mut dirs = self.dirs.lock().unwrap();
        dirs.entry(dir.to_path_buf()).or_default();
        let mut at = dir;
        while let (Some(parent), Some(name)) = (at.parent(), at.file_name()) {
            let names = dirs.entry(parent.to_path_buf()).or_default();
            names.push(name.to_string_lossy().into_owned());
            names.sort();
            names.dedup();
            at = parent;
        }
    }

    fn done(&self) -> Vec<String> {
        self.done.lock().unwrap().clone()
    }
}

impl NodeView for FakeNode {
    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        Ok(self
            .dirs
            .lock()
            .unwrap()
            .get(dir)
            .cloned()
            .unwrap_or_default())
    }
    fn exists(&self, path: &Path) -> bool {
        self.dirs.lock().unwrap().contains_key(path)
    }
    fn mount_points(&self) -> std::io::Result<Vec<PathBuf>> {
        Ok(self.mounts.lock().unwrap().clone())
    }
    fn monitors(&self) -> Vec<(i32, PathBuf)> {
        self.monitors.lock().unwrap().clone()
    }
    fn cgroup_children(&self, cgroup: &str) -> Vec<String> {
        self.cgroups
            .lock()
            .unwrap()
            .get(cgroup)
            .cloned()
            .unwrap_or_default()
    }
    fn cgroup_exists(&self, cgroup: &str) -> bool {
        self.cgroups.lock().unwrap().contains_key(cgroup)
    }
    fn cgroup_processes(&self, _cgroup: &str) -> usize {
        2
    }
    fn bundle_cgroups_path(&self, bundle: &Path) -> Option<String> {
        self.bundles.get(bundle).cloned()
    }
    fn disk_bytes(&self, path: &Path) -> u64 {
        if self.exists(path) { 4096 } else { 0 }
    }
    fn unmount(&self, path: &Path) -> Result<(), String> {
        self.mounts.lock().unwrap().retain(|m| m != path);
        self.done
            .lock()
            .unwrap()
            .push(format!("unmount {}", path.display()));
        Ok(())
    }
    fn remove_tree(&self, path: &Path) -> Result<(), String> {
        if let Some(m) = self
            .mounts
            .lock()
            .unwrap()
            .iter()
            .find(|m| m.starts_with(path))
        {
            return Err(format!("{} is still mounted", m.display()));
        }
        let mut dirs = self.dirs.lock().unwrap();
        dirs.retain(|d, _| !d.starts_with(path));
        if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
            && let Some(names) = dirs.get_mut(parent)
        {
            names.retain(|n| n.as_str() != name.to_string_lossy());
        }
        drop(dirs);
        self.done
            .lock()
            .unwrap()
            .push(format!("remove {}", path.display()));
        Ok(())
    }
    fn kill_monitor(&self, pid: i32, _state_dir: &Path) -> Result<(), String> {
        self.monitors.lock().unwrap().retain(|(p, _)| *p != pid);
        self.done.lock().unwrap().push(format!("kill {pid}"));
        Ok(())
    }
    fn delete_cgroup(&self, cgroup: &str, unit: Option<&str>) -> Result<(), String> {
        self.cgroups
            .lock()
            .unwrap()
            .retain(|c, _| c != cgroup && !c.starts_with(&format!("{cgroup}/")));
        self.done
            .lock()
            .unwrap()
            .push(format!("cgroup {cgroup} {unit:?}"));
        Ok(())
    }
}

/// A side with no image store and records it cannot repair; `busy`: a
/// life-cycle step is at work on every container and pod.
#[derive(Default)]
struct FakeSide {
    busy: bool,
}

#[async_trait::async_trait]
impl Side for FakeSide {
    async fn content(&self, _remove: bool) -> Result<Vec<OrphanContent>, CheckError> {
        Ok(Vec::new())
    }
    async fn remove_container(&self, _id: &str) -> Result<(), String> {
        Err("not here".into())
    }
    async fn remove_pod(&self, _id: &str) -> Result<(), String> {
        Err("not here".into())
    }
    async fn release_lease(&self, _holder: &str) -> Result<(), String> {
        Ok(())
    }
    fn in_step(&self, _id: &str, _pod: bool) -> bool {
        self.busy
    }
}

fn id(c: char) -> String {
    c.to_string().repeat(64)
}

fn config(dir: &Path) -> Config {
    Config {
        root: dir.join("root"),
        run_dir: dir.join("run"),
        ..Config::default()
    }
}

/// A container record as the store keeps it (only what the check reads
/// matters).
fn container_record(config: &Config, id: &str, pod: &str) -> ContainerRecord {
    let state_dir = config.run_dir.join("containers").join(id);
    serde_json::from_value(serde_json::json!({
        "id": id, "pod_id": pod, "name": "c", "attempt": 0, "state": "running",
        "created_at": 1, "started_at": 1, "finished_at": 0, "exit_code": 0,
        "reason": "", "message": "", "image": "i", "image_ref": "sha256:x",
        "labels": {}, "annotations": {}, "log_path": null, "config": "",
        "handler": "", "runtime": {"kind": "embedded", "root": "/r"},
        "state_dir": state_dir, "bundle": state_dir.join("bundle"),
        "rootfs": state_dir.join("bundle/rootfs"),
        "layer_dir": config.root.join("containers").join(id),
        "user": null, "resources": null, "stop_signal": 15, "pid": 1,
        "cgroups_path": format!("/crust/crust-{pod}/crust-{id}"),
    }))
    .unwrap()
}

/// Container `b`'s dirs, rootfs mount, monitor and cgroup (in the pod
/// cgroup of `a`, which has no record either), its bundle naming that
/// cgroup, and a lease of it: a container whose record (and pod's) is
/// gone.
fn node_with_orphan_container(config: &Config) -> FakeNode {
    let b = id('b');
    let state = config.run_dir.join("containers").join(&b);
    let mut node = FakeNode::default();
    node.add_dir(&state.join("bundle/rootfs"));
    node.add_dir(&config.root.join("containers").join(&b).join("upper"));
    node.add_dir(&config.run_dir.join("runtimes/default").join(&b));
    node.mounts
        .lock()
        .unwrap()
        .push(state.join("bundle/rootfs"));
    *node.monitors.lock().unwrap() = vec![(42, state.clone())];
    let pod_cgroup = format!("/crust/crust-{}", id('a'));
    let cgroup = format!("{pod_cgroup}/crust-{b}");
    node.cgroups.lock().unwrap().insert(pod_cgroup, vec![]);
    node.cgroups.lock().unwrap().insert(cgroup.clone(), vec![]);
    node.bundles.insert(state.join("bundle"), cgroup);
    node
}

#[tokio::test]
async fn an_orphan_container_is_found_whole_and_repaired_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let store = Arc::new(Store::open(&tmp.path().join("meta.db")).unwrap());
    let node = Arc::new(node_with_orphan_container(&config));
    let side = FakeSide::default();
    let b = id('b');

    let report = run(&config, store.clone(), node.clone(), &side, false)
        .await
        .unwrap();
    let found: Vec<(OrphanKind, String)> = report
        .orphans
        .iter()
        .map(|o| (o.kind, o.id.clone()))
        .collect();
    // The pod cgroup named by the bundle's parent: only the top one is
    // listed (the container's goes with it).
    assert_eq!(
        found,
        vec![
            (OrphanKind::ContainerDirs, b.clone()),
            (OrphanKind::Mounts, b.clone()),
            (OrphanKind::Monitors, b.clone()),
            (OrphanKind::Cgroups, id('a')),
        ],
        "{report:#?}"
    );
    assert_eq!(report.orphans[0].paths.len(), 3);
    assert_eq!(report.orphans[0].bytes, 3 * 4096);
    assert!(report.orphans[3].detail.contains("2 processes"));
    assert!(
        node.done().is_empty(),
        "a check without repair changed {:?}",
        node.done()
    );
    let left = report.left_by_kind();
    assert_eq!(left.len(), OrphanKind::ALL.len());
    assert!(left.contains(&(OrphanKind::ContainerDirs, 1, 3 * 4096)));

    let report = run(&config, store.clone(), node.clone(), &side, true)
        .await
        .unwrap();
    assert!(report.orphans.iter().all(|o| !o.left()), "{report:#?}");
    let done = node.done();
    let state = config.run_dir.join("containers").join(&b);
    assert_eq!(
        done,
        vec![
            format!("cgroup /crust/crust-{} None", id('a')),
            "kill 42".to_string(),
            format!("unmount {}", state.join("bundle/rootfs").display()),
            format!("remove {}", state.display()),
            format!(
                "remove {}",
                config.root.join("containers").join(&b).display()
            ),
            format!(
                "remove {}",
                config.run_dir.join("runtimes/default").join(&b).display()
            ),
        ]
    );
    // Nothing left.
    let again = run(&config, store, node.clone(), &side, false)
        .await
        .unwrap();
    assert_eq!(again.orphans, vec![]);
}

#[tokio::test]
async fn what_has_a_record_by_the_time_of_the_repair_is_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let store = Arc::new(Store::open(&tmp.path().join("meta.db")).unwrap());
    let node: Arc<dyn NodeView> = Arc::new(node_with_orphan_container(&config));
    let b = id('b');
    let mut report = run(
        &config,
        store.clone(),
        node.clone(),
        &FakeSide::default(),
        false,
    )
    .await
    .unwrap();
    // Its record appears after the check listed the node.
    store.put(&container_record(&config, &b, &id('a'))).unwrap();
    repair_all(&mut report.orphans, &store, &node, &FakeSide::default()).await;
    for o in report.orphans.iter().filter(|o| o.id == b) {
        assert_eq!(
            o.outcome,
            Some(Err("it has a record now: left alone".to_string())),
            "{o:?}"
        );
    }
}

#[tokio::test]
async fn dirs_under_a_mount_are_never_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let store = Arc::new(Store::open(&tmp.path().join("meta.db")).unwrap());
    let node = node_with_orphan_container(&config);
    let b = id('b');
    let layer = config.root.join("containers").join(&b);
    let node = Arc::new(node);
    let mut report = run(
        &config,
        store.clone(),
        node.clone(),
        &FakeSide::default(),
        false,
    )
    .await
    .unwrap();
    // Mounted after the check listed the node: its dir stays.
    node.mounts.lock().unwrap().push(layer.join("upper"));
    let node_dyn: Arc<dyn NodeView> = node.clone();
    repair_all(&mut report.orphans, &store, &node_dyn, &FakeSide::default()).await;
    let dirs = report
        .orphans
        .iter()
        .find(|o| o.kind == OrphanKind::ContainerDirs)
        .unwrap();
    assert!(
        matches!(&dirs.outcome, Some(Err(e)) if e.contains("still mounted")),
        "{dirs:?}"
    );
    assert!(node.exists(&layer.join("upper")));
}

#[tokio::test]
async fn a_container_whose_pod_has_no_record_takes_the_pod_cgroup_along() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let store = Arc::new(Store::open(&tmp.path().join("meta.db")).unwrap());
    // A container whose pod has no record, in place otherwise.
    let (c, p) = (id('c'), id('d'));
    let rec = container_record(&config, &c, &p);
    store.put(&rec).unwrap();
    let node = FakeNode::default();
    node.add_dir(&rec.state_dir);
    let pod_cgroup = format!("/crust/crust-{p}");
    for cg in [pod_cgroup.clone(), format!("{pod_cgroup}/crust-{c}")] {
        node.cgroups.lock().unwrap().insert(cg, vec![]);
    }
    let node = Arc::new(node);
    let report = run(&config, store, node.clone(), &FakeSide::default(), true)
        .await
        .unwrap();
    type Got<'a> = (OrphanKind, &'a str, Option<Result<(), String>>);
    let got: Vec<Got> = report
        .orphans
        .iter()
        .map(|o| (o.kind, o.id.as_str(), o.outcome.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (OrphanKind::Cgroups, p.as_str(), Some(Ok(()))),
            (
                OrphanKind::ContainerRecords,
                c.as_str(),
                Some(Err("not here".to_string()))
            )
        ]
    );
    assert_eq!(node.done(), vec![format!("cgroup {pod_cgroup} None")]);
}

#[tokio::test]
async fn a_record_a_step_is_at_work_on_is_no_orphan() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let store = Arc::new(Store::open(&tmp.path().join("meta.db")).unwrap());
    // Its pod has no record and its dirs are gone: an orphan record, but
    // for the step at work on it (a removal takes the dirs first).
    store
        .put(&container_record(&config, &id('c'), &id('d')))
        .unwrap();
    let node: Arc<dyn NodeView> = Arc::new(FakeNode::default());
    let busy = FakeSide { busy: true };
    let report = run(&config, store.clone(), node.clone(), &busy, true)
        .await
        .unwrap();
    assert_eq!(report.orphans, vec![]);
    let idle = FakeSide::default();
    let report = run(&config, store, node, &idle, false).await.unwrap();
    let kinds: Vec<OrphanKind> = report.orphans.iter().map(|o| o.kind).collect();
    assert_eq!(kinds, vec![OrphanKind::ContainerRecords]);
}

#[tokio::test]
async fn what_went_between_the_listing_and_the_records_is_no_orphan() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let store = Arc::new(Store::open(&tmp.path().join("meta.db")).unwrap());
    let node = node_with_orphan_container(&config);
    // Listed, but gone by the time it is looked at again (a removal that
    // finished meanwhile): its dir, its monitor, its mount.
    let gone = id('e');
    node.dirs
        .lock()
        .unwrap()
        .entry(config.run_dir.join("containers"))
        .or_default()
        .push(gone.clone());
    let node: Arc<dyn NodeView> = Arc::new(node);
    let report = run(&config, store, node, &FakeSide::default(), false)
        .await
        .unwrap();
    assert!(report.orphans.iter().all(|o| o.id != gone), "{report:#?}");
    assert!(report.orphans.iter().any(|o| o.id == id('b')));
}

#[tokio::test]
async fn runtime_roots_the_records_name_are_looked_in() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let store = Arc::new(Store::open(&tmp.path().join("meta.db")).unwrap());
    // A container of a handler whose root is outside the run dir (one a
    // reload removed, say): the state of another ID there is an orphan.
    let rec = container_record(&config, &id('c'), &id('d'));
    store.put(&rec).unwrap();
    let node = FakeNode::default();
    node.add_dir(&rec.state_dir);
    node.add_dir(&PathBuf::from("/r").join(id('c')));
    node.add_dir(&PathBuf::from("/r").join(id('e')));
    let node: Arc<dyn NodeView> = Arc::new(node);
    let report = run(&config, store, node, &FakeSide::default(), false)
        .await
        .unwrap();
    let dirs: Vec<(&str, &Vec<PathBuf>)> = report
        .orphans
        .iter()
        .filter(|o| o.kind == OrphanKind::ContainerDirs)
        .map(|o| (o.id.as_str(), &o.paths))
        .collect();
    assert_eq!(
        dirs,
        vec![(id('e').as_str(), &vec![PathBuf::from("/r").join(id('e'))])]
    );
}
