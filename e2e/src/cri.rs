//! A CRI client for the Kubernetes suite and the CRI benchmark: the generated CRI v1 API
//! (`k8s-cri`, tonic) over containerd's Unix socket, exactly what kubelet speaks, wrapped in
//! blocking calls with a timeout, plus pod/container builders shaped like kubelet's requests
//! and the leftovers check a torn-down pod must pass.
//!
//! Handlers (hack/containerd.sh): `runc` (the baseline), `agent-sandbox` (the built-in agent
//! profile as ceiling) and `agent-sandbox-e2e` (ceiling `/etc/agent-sandbox/cri-e2e.toml`,
//! written by hack/cri.sh, allowing only the tests' local registry; its runtime options are
//! the file `/etc/agent-sandbox/cri-e2e-runtime.toml`, since containerd 1.6 passes a non-runc
//! shim only the options' `ConfigPath`). When the build under test
//! is not the installed one (`AGENT_SANDBOX_BIN_DIR`), the handlers are the ones of
//! `/etc/containerd/config.toml` whose `runtime_type` is that build's shim by absolute path;
//! `AGENT_SANDBOX_CRI_HANDLER` / `AGENT_SANDBOX_CRI_E2E_HANDLER` name them explicitly.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    AttachRequest, CheckpointContainerRequest, ContainerConfig, ContainerFilter, ContainerMetadata,
    ContainerStats, ContainerStatsFilter, ContainerStatsRequest, ContainerStatus,
    ContainerStatusRequest, CreateContainerRequest, ExecRequest, ExecSyncRequest, ImageSpec,
    ImageStatusRequest, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListContainerStatsRequest,
    ListContainersRequest, NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
    PodSandboxStatus, PodSandboxStatusRequest, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
    UpdateContainerResourcesRequest, VersionRequest,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::ctr;
use crate::harness::{self, DEFAULT_TIMEOUT};

/// containerd's socket; the CRI plugin serves on it.
pub const SOCKET: &str = "/run/containerd/containerd.sock";
/// Names another containerd's socket for the CRI client: one whose handlers run a build under
/// test (the shared containerd learns new handlers only with a restart).
pub const SOCKET_ENV: &str = "AGENT_SANDBOX_CRI_SOCKET";

/// The socket the CRI client dials: [`SOCKET_ENV`] if set, else [`SOCKET`].
pub fn socket() -> String {
    std::env::var(SOCKET_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| SOCKET.to_owned())
}
/// containerd's configuration (read to find the handlers of a build under test).
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// The containerd namespace the CRI plugin keeps its pods, containers and images in.
pub const NAMESPACE: &str = "k8s.io";
/// The CRI's sandbox ("pause") image (bundles/pause).
pub const PAUSE_IMAGE: &str = "localhost/agent-sandbox/pause:latest";
/// The baseline handler (containerd-shim-runc-v2 with runc).
pub const RUNC_HANDLER: &str = "runc";
/// The production handler with the installed build.
pub const SANDBOX_HANDLER: &str = "agent-sandbox";
/// The test handler with the installed build.
pub const E2E_HANDLER: &str = "agent-sandbox-e2e";
/// The ceiling policy of the test handlers (hack/cri.sh).
pub const E2E_POLICY: &str = "/etc/agent-sandbox/cri-e2e.toml";
/// The runtime options file (`ConfigPath`) of the test handlers, naming [`E2E_POLICY`].
pub const E2E_RUNTIME_OPTIONS: &str = "/etc/agent-sandbox/cri-e2e-runtime.toml";
/// Names the sandbox handler explicitly.
pub const HANDLER_ENV: &str = "AGENT_SANDBOX_CRI_HANDLER";
/// Names the test handler explicitly.
pub const E2E_HANDLER_ENV: &str = "AGENT_SANDBOX_CRI_E2E_HANDLER";
/// The Kubernetes namespace the test pods claim.
pub const POD_NAMESPACE: &str = "agent-sandbox-e2e";
/// Where kubelet would keep pod logs; each test pod gets a directory below.
pub const POD_LOG_ROOT: &str = "/var/log/pods";
/// The cgroup parent of every test pod, as kubelet's cgroupfs driver names it.
pub const CGROUP_ROOT: &str = "/kubepods/besteffort";

/// The handler running the build under test with the built-in agent profile as ceiling.
pub fn sandbox_handler() -> anyhow::Result<String> {
    handler_for(HANDLER_ENV, SANDBOX_HANDLER, None)
}

/// The handler running the build under test with [`E2E_POLICY`] as ceiling (its options'
/// `ConfigPath` is [`E2E_RUNTIME_OPTIONS`]).
pub fn e2e_handler() -> anyhow::Result<String> {
    handler_for(E2E_HANDLER_ENV, E2E_HANDLER, Some(E2E_RUNTIME_OPTIONS))
}

/// `options`: the `ConfigPath` the handler's runtime options must name (none: no options).
fn handler_for(env: &str, installed: &str, options: Option<&str>) -> anyhow::Result<String> {
    if let Some(name) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        return Ok(name.to_string_lossy().into_owned());
    }
    if harness::default_bin_dir() {
        return Ok(installed.to_owned());
    }
    let shim = harness::shim_bin();
    let text = fs::read_to_string(CONTAINERD_CONFIG)
        .with_context(|| format!("cannot read {CONTAINERD_CONFIG}"))?;
    let handlers = handlers_running(&text, &shim, options)
        .with_context(|| format!("cannot parse {CONTAINERD_CONFIG}"))?;
    handlers.into_iter().next().with_context(|| {
        format!(
            "no CRI handler in {CONTAINERD_CONFIG} runs {} with {}; add one (runtime_type = \
             that path{}) or name it in {env}",
            shim.display(),
            options.map_or_else(|| "no options".to_owned(), |p| format!("ConfigPath {p}")),
            options.map_or_else(String::new, |p| format!(", options ConfigPath = {p:?}")),
        )
    })
}

/// The handlers (sorted) of a containerd config whose `runtime_type` is `shim` and whose
/// `options.ConfigPath` is `options`.
fn handlers_running(
    config: &str,
    shim: &Path,
    options: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let doc: toml::Table = toml::from_str(config)?;
    let runtimes = doc
        .get("plugins")
        .and_then(|p| p.get("io.containerd.grpc.v1.cri"))
        .and_then(|c| c.get("containerd"))
        .and_then(|c| c.get("runtimes"))
        .and_then(toml::Value::as_table)
        .context("no [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes] table")?;
    let mut names: Vec<String> = runtimes
        .iter()
        .filter(|(_, r)| {
            r.get("runtime_type").and_then(toml::Value::as_str) == shim.to_str()
                && r.get("options")
                    .and_then(|o| o.get("ConfigPath"))
                    .and_then(toml::Value::as_str)
                    == options
        })
        .map(|(name, _)| name.clone())
        .collect();
    names.sort();
    Ok(names)
}

/// A blocking CRI client (runtime and image services) on [`socket`].
pub struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
}

impl Cri {
    /// Connects and checks that the CRI plugin answers `Version`.
    pub fn connect() -> anyhow::Result<Self> {
        let socket = socket();
        harness::require_file(&socket)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot build a tokio runtime")?;
        // The URI is required by tonic but unused: the connector dials the socket.
        let channel = rt
            .block_on(
                Endpoint::try_from("http://[::1]:50051")?.connect_with_connector(
                    tower::service_fn(move |_: Uri| {
                        let socket = socket.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                UnixStream::connect(socket).await?,
                            ))
                        }
                    }),
                ),
            )
            .with_context(|| format!("cannot connect to the CRI on {}", self::socket()))?;
        let cri = Self {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            timeout: DEFAULT_TIMEOUT,
        };
        let version = cri
            .call("Version", |mut c| async move {
                c.version(VersionRequest::default()).await
            })
            .context("containerd's CRI plugin does not answer; run hack/setup.sh")?;
        if version.runtime_api_version != "v1" {
            bail!("CRI answers API {} (want v1)", version.runtime_api_version);
        }
        Ok(cri)
    }

    /// Runs one runtime-service call with the client's timeout; the error carries the CRI
    /// status (`err.downcast_ref::<tonic::Status>()`) under the call's name.
    fn call<T, F, Fut>(&self, name: &str, f: F) -> anyhow::Result<T>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let fut = f(self.runtime.clone());
        let timeout = self.timeout;
        match self
            .rt
            .block_on(async move { tokio::time::timeout(timeout, fut).await })
        {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(anyhow::Error::new(status).context(format!("CRI {name}"))),
            Err(_) => bail!("CRI {name} timed out after {:?}", self.timeout),
        }
    }

    /// An error unless the CRI image store (containerd namespace k8s.io) has `image`.
    pub fn require_image(&self, image: &str) -> anyhow::Result<()> {
        let mut images = self.images.clone();
        let request = ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        let status = self
            .rt
            .block_on(async {
                tokio::time::timeout(self.timeout, images.image_status(request)).await
            })
            .context("CRI ImageStatus timed out")?
            .context("CRI ImageStatus")?
            .into_inner();
        if status.image.is_none() {
            bail!(
                "image {image} is missing from containerd's {NAMESPACE} namespace; run \
                 hack/setup.sh (hack/images.sh imports it)"
            );
        }
        Ok(())
    }

    /// RunPodSandbox.
    pub fn run_pod(&self, config: &PodSandboxConfig, handler: &str) -> anyhow::Result<String> {
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.to_owned(),
        };
        self.call("RunPodSandbox", |mut c| async move {
            c.run_pod_sandbox(request).await
        })
        .map(|r| r.pod_sandbox_id)
    }

    /// PodSandboxStatus (verbose: with containerd's info map).
    pub fn pod_status(
        &self,
        pod_id: &str,
    ) -> anyhow::Result<(PodSandboxStatus, HashMap<String, String>)> {
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: pod_id.to_owned(),
            verbose: true,
        };
        let response = self.call("PodSandboxStatus", |mut c| async move {
            c.pod_sandbox_status(request).await
        })?;
        let status = response.status.context("PodSandboxStatus without status")?;
        Ok((status, response.info))
    }

    /// StopPodSandbox.
    pub fn stop_pod(&self, pod_id: &str) -> anyhow::Result<()> {
        let request = StopPodSandboxRequest {
            pod_sandbox_id: pod_id.to_owned(),
        };
        self.call("StopPodSandbox", |mut c| async move {
            c.stop_pod_sandbox(request).await
        })
        .map(drop)
    }

    /// RemovePodSandbox.
    pub fn remove_pod(&self, pod_id: &str) -> anyhow::Result<()> {
        let request = RemovePodSandboxRequest {
            pod_sandbox_id: pod_id.to_owned(),
        };
        self.call("RemovePodSandbox", |mut c| async move {
            c.remove_pod_sandbox(request).await
        })
        .map(drop)
    }

    /// CreateContainer.
    pub fn create_container(
        &self,
        pod_id: &str,
        pod: &PodSandboxConfig,
        config: &ContainerConfig,
    ) -> anyhow::Result<String> {
        let request = CreateContainerRequest {
            pod_sandbox_id: pod_id.to_owned(),
            config: Some(config.clone()),
            sandbox_config: Some(pod.clone()),
        };
        self.call("CreateContainer", |mut c| async move {
            c.create_container(request).await
        })
        .map(|r| r.container_id)
    }

    /// StartContainer.
    pub fn start_container(&self, id: &str) -> anyhow::Result<()> {
        let request = StartContainerRequest {
            container_id: id.to_owned(),
        };
        self.call("StartContainer", |mut c| async move {
            c.start_container(request).await
        })
        .map(drop)
    }

    /// StopContainer with a grace period in seconds.
    pub fn stop_container(&self, id: &str, grace_seconds: i64) -> anyhow::Result<()> {
        let request = StopContainerRequest {
            container_id: id.to_owned(),
            timeout: grace_seconds,
        };
        self.call("StopContainer", |mut c| async move {
            c.stop_container(request).await
        })
        .map(drop)
    }

    /// CheckpointContainer: the container's checkpoint archive written to `location` (a
    /// path on the node), the container left running, as kubelet's checkpoint API asks.
    pub fn checkpoint_container(&self, id: &str, location: &str) -> anyhow::Result<()> {
        let request = CheckpointContainerRequest {
            container_id: id.to_owned(),
            location: location.to_owned(),
            timeout: 0,
        };
        self.call("CheckpointContainer", |mut c| async move {
            c.checkpoint_container(request).await
        })
        .map(drop)
    }

    /// RemoveContainer.
    pub fn remove_container(&self, id: &str) -> anyhow::Result<()> {
        let request = RemoveContainerRequest {
            container_id: id.to_owned(),
        };
        self.call("RemoveContainer", |mut c| async move {
            c.remove_container(request).await
        })
        .map(drop)
    }

    /// ContainerStatus.
    pub fn container_status(&self, id: &str) -> anyhow::Result<ContainerStatus> {
        let request = ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        self.call("ContainerStatus", |mut c| async move {
            c.container_status(request).await
        })?
        .status
        .context("ContainerStatus without status")
    }

    /// The host pid of a container's init process, from containerd's verbose status.
    pub fn container_pid(&self, id: &str) -> anyhow::Result<u32> {
        let request = ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        };
        let response = self.call("ContainerStatus", |mut c| async move {
            c.container_status(request).await
        })?;
        let info: serde_json::Value = serde_json::from_str(
            response
                .info
                .get("info")
                .context("ContainerStatus has no verbose info")?,
        )
        .context("bad ContainerStatus info")?;
        info["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0)
            .with_context(|| format!("ContainerStatus info has no pid: {info}"))
    }

    /// Ids of the containers of `pod_id` (ListContainers).
    pub fn list_containers(&self, pod_id: &str) -> anyhow::Result<Vec<String>> {
        let request = ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: pod_id.to_owned(),
                ..Default::default()
            }),
        };
        Ok(self
            .call("ListContainers", |mut c| async move {
                c.list_containers(request).await
            })?
            .containers
            .into_iter()
            .map(|c| c.id)
            .collect())
    }

    /// ExecSync with a timeout in seconds (0: none). The client waits that long plus a
    /// margin for containerd to give up on its own.
    pub fn exec_sync(&self, id: &str, cmd: &[&str], timeout_s: i64) -> anyhow::Result<Exec> {
        let request = ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: timeout_s,
        };
        let started = std::time::Instant::now();
        let response = self.call(
            "ExecSync",
            |mut c| async move { c.exec_sync(request).await },
        )?;
        Ok(Exec {
            command: cmd.join(" "),
            exit_code: response.exit_code,
            stdout: String::from_utf8_lossy(&response.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&response.stderr).into_owned(),
            elapsed: started.elapsed(),
        })
    }

    /// Exec, the streaming call behind `kubectl exec`: the one-time URL on containerd's
    /// streaming server that [`crate::stream::Session::connect`] opens. A `tty` stream has no
    /// separate stderr (CRI refuses both).
    pub fn exec_url(
        &self,
        id: &str,
        cmd: &[&str],
        stdin: bool,
        tty: bool,
    ) -> anyhow::Result<String> {
        let request = ExecRequest {
            container_id: id.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            tty,
            stdin,
            stdout: true,
            stderr: !tty,
        };
        let response = self.call("Exec", |mut c| async move { c.exec(request).await })?;
        Ok(response.url)
    }

    /// Attach, the streaming call behind `kubectl attach`: the URL of a stream to the
    /// container's own stdio.
    pub fn attach_url(&self, id: &str, stdin: bool, tty: bool) -> anyhow::Result<String> {
        let request = AttachRequest {
            container_id: id.to_owned(),
            stdin,
            tty,
            stdout: true,
            stderr: !tty,
        };
        let response = self.call("Attach", |mut c| async move { c.attach(request).await })?;
        Ok(response.url)
    }

    /// ContainerStats.
    pub fn container_stats(&self, id: &str) -> anyhow::Result<ContainerStats> {
        let request = ContainerStatsRequest {
            container_id: id.to_owned(),
        };
        self.call("ContainerStats", |mut c| async move {
            c.container_stats(request).await
        })?
        .stats
        .context("ContainerStats without stats")
    }

    /// ListContainerStats of one pod.
    pub fn list_container_stats(&self, pod_id: &str) -> anyhow::Result<Vec<ContainerStats>> {
        let request = ListContainerStatsRequest {
            filter: Some(ContainerStatsFilter {
                pod_sandbox_id: pod_id.to_owned(),
                ..Default::default()
            }),
        };
        Ok(self
            .call("ListContainerStats", |mut c| async move {
                c.list_container_stats(request).await
            })?
            .stats)
    }

    /// UpdateContainerResources (Linux resources only).
    pub fn update_resources(
        &self,
        id: &str,
        resources: LinuxContainerResources,
    ) -> anyhow::Result<()> {
        let request = UpdateContainerResourcesRequest {
            container_id: id.to_owned(),
            linux: Some(resources),
            ..Default::default()
        };
        self.call("UpdateContainerResources", |mut c| async move {
            c.update_container_resources(request).await
        })
        .map(drop)
    }
}

/// What an ExecSync returned.
#[derive(Debug, Clone)]
pub struct Exec {
    pub command: String,
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Exec {
    /// As a harness [`harness::Output`], for probe parsing and failure messages.
    pub fn output(&self) -> harness::Output {
        harness::Output {
            command: format!("CRI ExecSync {}", self.command),
            code: Some(self.exit_code),
            signal: None,
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            elapsed: self.elapsed,
        }
    }
}

impl std::fmt::Display for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.output())
    }
}

/// The CRI status in an error from [`Cri`], if the CRI answered with one.
pub fn status_of(err: &anyhow::Error) -> Option<&tonic::Status> {
    err.downcast_ref::<tonic::Status>()
}

fn image_spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

/// A pod sandbox config as kubelet builds it: metadata, hostname, log directory, cgroup
/// parent `CGROUP_ROOT/pod<uid>`, pod-shared network and IPC, per-container PID namespaces.
pub fn pod_config(name: &str, annotations: &[(&str, &str)]) -> PodSandboxConfig {
    let uid = ctr::unique_id("uid");
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.clone(),
            namespace: POD_NAMESPACE.to_owned(),
            attempt: 0,
        }),
        hostname: name.chars().take(63).collect(),
        log_directory: format!("{POD_LOG_ROOT}/{POD_NAMESPACE}_{name}_{uid}"),
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        labels: HashMap::from([("app".to_owned(), "agent-sandbox-e2e".to_owned())]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: format!("{CGROUP_ROOT}/pod{uid}"),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Makes `config` a hostNetwork pod's, as kubelet sends it: the node's network namespace, and
/// no hostname (kubelet leaves it to the node's; runc refuses to set one without a UTS
/// namespace of its own).
pub fn host_network(config: &mut PodSandboxConfig) {
    config.hostname.clear();
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.network = NamespaceMode::Node as i32;
    }
}

/// A container config: `image` running `command`, with `env`, logging to `NAME.log` in the
/// pod's log directory.
pub fn container_config(
    name: &str,
    image: &str,
    command: &[&str],
    env: &[(&str, &str)],
) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.to_owned(),
            attempt: 0,
        }),
        image: Some(image_spec(image)),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        envs: env
            .iter()
            .map(|(k, v)| KeyValue {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources::default()),
            security_context: Some(Default::default()),
        }),
        ..Default::default()
    }
}

/// A pod that is stopped and removed (with its containers, log directory and pod cgroup
/// directories, as kubelet would) when dropped.
pub struct Pod<'a> {
    pub cri: &'a Cri,
    pub id: String,
    pub config: PodSandboxConfig,
    pub handler: String,
    removed: bool,
}

impl<'a> Pod<'a> {
    /// Creates the pod's log directory (kubelet's job) and runs the sandbox.
    pub fn run(cri: &'a Cri, config: PodSandboxConfig, handler: &str) -> anyhow::Result<Self> {
        fs::create_dir_all(&config.log_directory)
            .with_context(|| format!("cannot create {}", config.log_directory))?;
        let id = match cri.run_pod(&config, handler) {
            Ok(id) => id,
            Err(e) => {
                let _ = fs::remove_dir_all(&config.log_directory);
                return Err(e);
            }
        };
        Ok(Self {
            cri,
            id,
            config,
            handler: handler.to_owned(),
            removed: false,
        })
    }

    /// CreateContainer in this pod.
    pub fn create(&self, config: &ContainerConfig) -> anyhow::Result<String> {
        self.cri.create_container(&self.id, &self.config, config)
    }

    /// CreateContainer + StartContainer.
    pub fn start(&self, config: &ContainerConfig) -> anyhow::Result<String> {
        let id = self.create(config)?;
        self.cri.start_container(&id)?;
        Ok(id)
    }

    /// The pod's network namespace path, from containerd's verbose status.
    pub fn netns_path(&self) -> anyhow::Result<Option<String>> {
        let (_, info) = self.cri.pod_status(&self.id)?;
        let info: serde_json::Value = match info.get("info") {
            Some(text) => serde_json::from_str(text).context("bad PodSandboxStatus info")?,
            None => return Ok(None),
        };
        Ok(info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|ns| ns["type"] == "network")
            .and_then(|ns| ns["path"].as_str())
            .filter(|p| !p.is_empty())
            .map(str::to_owned))
    }

    /// StopPodSandbox + RemovePodSandbox now, with errors.
    pub fn remove(mut self) -> anyhow::Result<()> {
        self.removed = true;
        let result = self
            .cri
            .stop_pod(&self.id)
            .and_then(|()| self.cri.remove_pod(&self.id));
        self.cleanup_host();
        result
    }

    /// What kubelet removes after a pod: its log directory and its pod-level cgroups.
    fn cleanup_host(&self) {
        let _ = fs::remove_dir_all(&self.config.log_directory);
        if let Some(parent) = self.config.linux.as_ref().map(|l| &l.cgroup_parent) {
            for ctrl in CGROUP_CONTROLLERS {
                let dir = Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(parent.trim_start_matches('/'));
                let _ = fs::remove_dir(dir);
            }
        }
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.cri.stop_pod(&self.id);
            let _ = self.cri.remove_pod(&self.id);
            self.cleanup_host();
        }
    }
}

/// The cgroup v1 controllers of this machine (FIELD-NOTES) that CRI containers get.
pub const CGROUP_CONTROLLERS: [&str; 9] = [
    "memory", "pids", "cpu", "cpuacct", "cpuset", "freezer", "devices", "blkio", "systemd",
];

/// Everything a removed pod could leave behind: processes (shims, proxies, pause) naming any
/// of `ids` on their command line, mounts, cgroups, runtime state and task bundles named after
/// them, and the pod's network namespace. Empty means clean.
pub fn leftovers(ids: &[&str], netns: Option<&str>) -> Vec<String> {
    let mut found = Vec::new();
    for id in ids {
        found.extend(ctr::leftovers(id, &[]));
        for pid in processes_naming(id) {
            found.push(format!("process {pid} ({}) names {id}", cmdline(pid)));
        }
        for ctrl in CGROUP_CONTROLLERS {
            let root = Path::new("/sys/fs/cgroup").join(ctrl).join("kubepods");
            found.extend(find_dirs_named(&root, id, 4));
        }
    }
    if let Some(netns) = netns.filter(|p| Path::new(p).exists()) {
        found.push(format!("network namespace {netns} still exists"));
    }
    found.sort();
    found.dedup();
    found
}

fn find_dirs_named(dir: &Path, name: &str, depth: u32) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path: PathBuf = e.path();
        if e.file_name().to_string_lossy().contains(name) {
            found.push(format!("cgroup {}", path.display()));
        } else if depth > 1 {
            found.extend(find_dirs_named(&path, name, depth - 1));
        }
    }
    found
}

/// Live processes whose command line contains `needle`.
pub fn processes_naming(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me && ctr::alive(*pid))
        .filter(|pid| cmdline(*pid).contains(needle))
        .collect()
}

fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

/// The host directory of `pid`'s cgroup for the v1 controller `ctrl`.
pub fn cgroup_dir(pid: u32, ctrl: &str) -> anyhow::Result<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .with_context(|| format!("cannot read /proc/{pid}/cgroup"))?;
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            ctrls.split(',').any(|c| c == ctrl).then(|| {
                Path::new("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(path.trim_start_matches('/'))
            })
        })
        .next()
        .with_context(|| format!("pid {pid} is in no {ctrl} cgroup:\n{text}"))
}

/// The CRI log lines of a container (`TIMESTAMP STREAM TAG MESSAGE`), message part only.
pub fn log_messages(path: &Path) -> anyhow::Result<Vec<String>> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .map(str::to_owned)
        .collect())
}

/// Environment lines (`KEY=VALUE`) into a map, for checks on `env` output.
pub fn env_map(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.b-dev]
  runtime_type = "/w/bin/containerd-shim-agent-sandbox"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.a-dev-e2e]
  runtime_type = "/w/bin/containerd-shim-agent-sandbox"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.a-dev-e2e.options]
    ConfigPath = "/etc/agent-sandbox/cri-e2e-runtime.toml"
"#;

    #[test]
    fn finds_handlers_by_shim_and_policy() {
        let shim = Path::new("/w/bin/containerd-shim-agent-sandbox");
        assert_eq!(handlers_running(CONFIG, shim, None).unwrap(), ["b-dev"]);
        assert_eq!(
            handlers_running(CONFIG, shim, Some(E2E_RUNTIME_OPTIONS)).unwrap(),
            ["a-dev-e2e"]
        );
        assert!(
            handlers_running(CONFIG, Path::new("/x"), None)
                .unwrap()
                .is_empty()
        );
        assert!(handlers_running("version = 2", shim, None).is_err());
    }

    #[test]
    fn pod_configs_are_unique_and_kubelet_shaped() {
        let a = pod_config("p", &[("io.agent.sandbox.pids", "64")]);
        let b = pod_config("p", &[]);
        let (ma, mb) = (a.metadata.unwrap(), b.metadata.unwrap());
        assert_ne!(ma.uid, mb.uid);
        assert!(a.log_directory.contains(&ma.uid));
        assert_eq!(a.annotations["io.agent.sandbox.pids"], "64");
        let linux = a.linux.unwrap();
        assert!(linux.cgroup_parent.ends_with(&format!("pod{}", ma.uid)));
        let ns = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.pid, NamespaceMode::Container as i32);
    }

    #[test]
    fn parses_env_lines() {
        let m = env_map("A=1\nB=x=y\nnoise\n");
        assert_eq!(m["A"], "1");
        assert_eq!(m["B"], "x=y");
        assert_eq!(m.len(), 2);
    }
}
