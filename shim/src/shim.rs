//! The shim binary's lifecycle actions: `start` (find or launch the daemon serving this
//! container's group), `delete` (clean up after a daemon that is gone) and the daemon itself.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::api::DeleteResponse;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Config, Error, ExitSignal, Flags, StartOpts};
use log::warn;

use crate::error::error_chain;
use crate::options::RuntimeOptions;
use crate::runtime::Runtime;
use crate::task::{DELETED_MARKER, TaskService};

/// Annotation CRI puts on every container of a pod: one shim serves the whole pod.
pub const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

/// Exit status reported for a container whose shim was gone (SIGKILL).
const KILLED: u32 = 128 + 9;

pub struct Shim {
    id: String,
    namespace: String,
    exit: Arc<ExitSignal>,
}

/// The shim group of a bundle: the pod's sandbox id if CRI set one, else the container id.
pub fn grouping(bundle: &Path, id: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Spec {
        #[serde(default)]
        annotations: std::collections::HashMap<String, String>,
    }
    std::fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Spec>(&b).ok())
        .and_then(|s| s.annotations.get(SANDBOX_ID_ANNOTATION).cloned())
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| id.to_owned())
}

fn io_err(context: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |err| Error::IoError {
        context: context.to_owned(),
        err,
    }
}

fn socket_path(address: &str) -> PathBuf {
    PathBuf::from(address.strip_prefix("unix://").unwrap_or(address))
}

#[async_trait]
impl containerd_shim::Shim for Shim {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Shim {
            id: args.id.clone(),
            namespace: args.namespace.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        let cwd = std::env::current_dir().map_err(io_err("current dir"))?;
        let group = grouping(&cwd, &opts.id);
        let address = containerd_shim::socket_address(&opts.address, &opts.namespace, &group);
        // containerd passes runtime options on stdin too; the daemon reads them from Create.
        let mut discard = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut discard);

        if group != opts.id
            && std::os::unix::net::UnixStream::connect(socket_path(&address)).is_ok()
        {
            // Another container of the same pod: its shim already serves this socket. (A
            // stale socket refuses the connection; the new daemon replaces it.)
            agent_sandbox_sys::atomic_file::write_atomic(Path::new("address"), &address)
                .map_err(io_err("write address"))?;
            return Ok(address);
        }

        let exe = std::env::current_exe().map_err(io_err("current exe"))?;
        let mut cmd = Command::new(exe);
        cmd.current_dir(&cwd)
            .args(["-namespace", &opts.namespace, "-id", &opts.id])
            .args(["-address", &opts.address, "-socket", &address])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // One malloc arena: the daemon is nearly single-threaded and RSS matters per pod.
            .env("MALLOC_ARENA_MAX", "1");
        if opts.debug {
            cmd.arg("-debug");
        }
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(io_err("spawn shim daemon"))?;
        // The daemon closes this pipe once its ttrpc server listens.
        if let Some(mut out) = child.stdout.take() {
            let mut buf = Vec::new();
            let _ = out.read_to_end(&mut buf);
        }
        if let Err(e) = containerd_shim::cgroup::adjust_oom_score(child.id()) {
            warn!("oom score of shim daemon: {e}");
        }
        agent_sandbox_sys::atomic_file::write_atomic(Path::new("address"), &address)
            .map_err(io_err("write address"))?;
        agent_sandbox_sys::atomic_file::write_atomic(Path::new("shim.pid"), child.id().to_string())
            .map_err(io_err("write shim.pid"))?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        let bundle = std::env::current_dir().map_err(io_err("current dir"))?;
        let opts = RuntimeOptions::load_persisted(&bundle, &self.namespace).unwrap_or_else(|e| {
            warn!("{}", error_chain(&e));
            RuntimeOptions::defaults(&self.namespace)
        });
        let deleted =
            std::fs::read_to_string(bundle.join(DELETED_MARKER)).is_ok_and(|id| id == self.id);
        if !deleted
            && let Err(e) = Runtime::new(&opts, &bundle)
                .delete(&self.id, true, None)
                .await
            && !e.is_missing_container()
        {
            warn!("{}", error_chain(&e));
        }
        crate::rootfs::unmount(&bundle);
        Ok(DeleteResponse {
            pid: 0,
            exit_status: KILLED,
            exited_at: Some(containerd_shim::util::timestamp()?).into(),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> TaskService {
        TaskService::new(publisher, self.namespace.clone(), self.exit.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_annotation_groups_containers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}"#,
        )
        .unwrap();
        assert_eq!(grouping(dir.path(), "c1"), "pod1");
        std::fs::write(dir.path().join("config.json"), r#"{"ociVersion":"1.0.2"}"#).unwrap();
        assert_eq!(grouping(dir.path(), "c1"), "c1");
        assert_eq!(grouping(Path::new("/nonexistent"), "c2"), "c2");
    }

    #[test]
    fn a_pods_containers_derive_the_pause_containers_socket() {
        let (pause, app) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let spec = |kind: &str| {
            format!(
                r#"{{"annotations":{{"io.kubernetes.cri.container-type":"{kind}","io.kubernetes.cri.sandbox-id":"pod1"}}}}"#
            )
        };
        std::fs::write(pause.path().join("config.json"), spec("sandbox")).unwrap();
        std::fs::write(app.path().join("config.json"), spec("container")).unwrap();
        let addr = "/run/containerd/containerd.sock";
        let of = |dir: &Path, id: &str| {
            containerd_shim::socket_address(addr, "k8s.io", &grouping(dir, id))
        };
        assert_eq!(of(pause.path(), "pod1"), of(app.path(), "app1"));
        // The same pod id in another containerd namespace is another shim.
        assert_ne!(
            of(app.path(), "app1"),
            containerd_shim::socket_address(addr, "default", "pod1")
        );
        // A container without the annotation gets a shim of its own.
        assert_ne!(
            of(Path::new("/nonexistent"), "app1"),
            of(pause.path(), "pod1")
        );
    }
}
