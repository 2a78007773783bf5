//! Names (docs/audit.md#finding-a-sandbox, #pods, #tool-call-ids): every review and audit
//! command takes every name an entry point shows (podman's name and short id, ctr's id, CRI's
//! `POD/CONTAINER` and `POD`, Docker's short id), without `--root`, live and after the
//! container is gone; a pod's network records are reachable from the pod and from its
//! containers; and every `exec` record names its process and tool call (ctr `--exec-id`, the
//! CRI argv form, podman/Docker `--env`), as its `exit` record does.
//!
//! The hostile-name property (a key that fits two sandboxes never picks one) is attacked
//! across two engines: a podman container named after a prefix of a ctr container's id.

use std::fs;
use std::path::Path;

use agent_sandbox_e2e::cri::{self, Cri, PAUSE_IMAGE, Pod, container_config, pod_config};
use agent_sandbox_e2e::ctr::{self, Container, Shim};
use agent_sandbox_e2e::docker::{self, Docker, docker_ok, full_id};
use agent_sandbox_e2e::harness::{self, TOOLS_IMAGE, User};
use agent_sandbox_e2e::net::{
    self, COLLECTOR_HOST, COLLECTOR_IP, HttpServer, REGISTRY_HOST, REGISTRY_IP, TOOL_CALL_ENV,
};
use agent_sandbox_e2e::podman::{Podman, Runtime};
use anyhow::{Context, ensure};
use serde_json::Value;

/// The records of `audit --json KEY` (the sandbox's, then a pod's network records).
fn records(key: &str) -> anyhow::Result<Vec<Value>> {
    let out = harness::runtime_ok(&["audit", "--json", key])?;
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad audit line {l:?}")))
        .collect()
}

/// The `exec` and `exit` records of the process named `process`.
fn exec_and_exit<'a>(
    records: &'a [Value],
    process: &str,
) -> (Option<&'a Value>, Option<&'a Value>) {
    let of = |kind: &str| {
        records
            .iter()
            .find(|r| r["kind"] == kind && r["data"]["process"] == process)
    };
    (of("exec"), of("exit"))
}

/// Both records of `process` carry `tool_call`.
fn tagged(records: &[Value], process: &str, tool_call: &str) -> anyhow::Result<()> {
    let (exec, exit) = exec_and_exit(records, process);
    for (kind, r) in [("exec", exec), ("exit", exit)] {
        let r = r.with_context(|| format!("no {kind} record of {process}: {records:#?}"))?;
        ensure!(
            r["data"]["tool_call_id"] == tool_call,
            "the {kind} record of {process} does not carry {tool_call}: {r}"
        );
    }
    Ok(())
}

/// `diff`, `export`, `promote --dry-run` and `audit verify` by `key` see the sandbox `id`
/// and its change `file`.
fn reviewable(key: &str, id: &str, file: &str, target: &Path) -> anyhow::Result<()> {
    let diff = harness::runtime_ok(&["diff", key])?;
    ensure!(
        diff.stdout.contains(file),
        "diff {key} misses {file}\n{diff}"
    );
    let out = tempfile::tempdir()?;
    let dir = out.path().join("export");
    harness::runtime_ok(&["export", "--to-dir", &dir.display().to_string(), key])?;
    ensure!(
        dir.join(file).is_file(),
        "export {key} did not write {file}"
    );
    let plan = harness::runtime_ok(&[
        "promote",
        "--dry-run",
        "--to",
        &target.display().to_string(),
        key,
    ])?;
    ensure!(
        plan.stdout.contains(file) && plan.stdout.contains(id),
        "promote --dry-run {key} does not plan {file} of {id}\n{plan}"
    );
    let verify = harness::runtime_ok(&["audit", "verify", key])?;
    ensure!(
        verify.stdout.contains(&format!("{id}.jsonl")),
        "audit verify {key} checked another log\n{verify}"
    );
    Ok(())
}

fn workspace() -> anyhow::Result<tempfile::TempDir> {
    let ws = tempfile::tempdir()?;
    fs::write(ws.path().join("README"), "host file\n")?;
    Ok(ws)
}

#[test]
fn cri_pod_and_container_names_reach_every_command_and_the_pods_network_records()
-> anyhow::Result<()> {
    net::ensure_test_hosts()?;
    let cri = Cri::connect()?;
    cri.require_image(PAUSE_IMAGE)?;
    cri.require_image(TOOLS_IMAGE)?;
    let registry = HttpServer::start(REGISTRY_IP, "names-registry")?;
    let collector = HttpServer::start(COLLECTOR_IP, "names-collector")?;
    let ws = workspace()?;
    let pod_name = harness::unique("nm", "pod");
    let pod = Pod::run(&cri, pod_config(&pod_name, &[]), &cri::e2e_handler()?)?;
    let mut config = container_config("agent", TOOLS_IMAGE, &["sleep", "3600"], &[]);
    config.mounts.push(k8s_cri::v1::Mount {
        container_path: "/workspace".to_owned(),
        host_path: ws.path().display().to_string(),
        ..Default::default()
    });
    let id = pod.start(&config)?;
    let pod_id = pod.id.clone();
    let member = format!("{pod_name}/agent");

    // The argv form: the program runs as `sh`, with the id in its environment.
    let call = format!("toolu_cri{}", std::process::id());
    let script = "tr '\\0' ' ' </proc/$$/cmdline; echo; echo call=$AGENT_SANDBOX_TOOL_CALL_ID; \
                  echo edited > /workspace/cri.txt";
    let assignment = format!("{TOOL_CALL_ENV}={call}");
    let out = cri.exec_sync(&id, &["env", &assignment, "sh", "-c", script], 30)?;
    ensure!(out.exit_code == 0, "{}", out.output());
    let argv = out.stdout.lines().next().unwrap_or_default();
    ensure!(
        argv.starts_with("sh -c ") && !argv.contains(&assignment),
        "the program saw the argv prefix: {argv:?}"
    );
    ensure!(
        out.stdout.contains(&format!("call={call}")),
        "the program does not see its tool call in its environment\n{}",
        out.output()
    );
    // A bad id in the argv form is refused before anything runs.
    let bad = cri.exec_sync(
        &id,
        &[
            "env",
            &format!("{TOOL_CALL_ENV}=bad id"),
            "sh",
            "-c",
            "echo ran",
        ],
        30,
    );
    ensure!(
        bad.as_ref()
            .map_or(true, |o| o.exit_code != 0 && !o.stdout.contains("ran")),
        "an exec with a bad tool-call id ran: {:?}",
        bad.map(|o| o.output())
    );
    let fetch = |host: &str, port: u16| {
        format!("curl -sS -m 15 -o /dev/null -w '%{{http_code}}' http://{host}:{port}/names")
    };
    // Through the pod's one proxy; the pod sandbox's records name this container's exec.
    let net_call = format!("toolu_net{}", std::process::id());
    let net_assignment = format!("{TOOL_CALL_ENV}={net_call}");
    let ok = cri.exec_sync(
        &id,
        &[
            "env",
            &net_assignment,
            "sh",
            "-c",
            &fetch(REGISTRY_HOST, registry.port()),
        ],
        30,
    )?;
    ensure!(ok.stdout.contains("200"), "{}", ok.output());
    let denied = cri.exec_sync(
        &id,
        &["sh", "-c", &fetch(COLLECTOR_HOST, collector.port())],
        30,
    )?;
    ensure!(denied.stdout.contains("403"), "{}", denied.output());

    let net_to = |rs: &[Value], host: &str, verdict: &str| {
        rs.iter().any(|r| {
            r["kind"] == "net" && r["data"]["host"] == host && r["data"]["verdict"] == verdict
        })
    };
    let check = |live: bool| -> anyhow::Result<()> {
        for key in [member.as_str(), id.as_str(), &id[..12]] {
            reviewable(key, &id, "cri.txt", ws.path())?;
        }
        // The container's own records, then the pod's network records.
        let mine = records(&member)?;
        let exec = mine
            .iter()
            .find(|r| r["kind"] == "exec" && r["data"]["tool_call_id"] == call.as_str())
            .with_context(|| format!("no exec record tagged {call}: {mine:#?}"))?;
        ensure!(
            exec["data"]["argv"][0] == "sh" && exec["sandbox"] == id.as_str(),
            "the exec record kept the prefix: {exec}"
        );
        let process = exec["data"]["process"]
            .as_str()
            .filter(|p| !p.is_empty() && *p != "exec")
            .with_context(|| format!("the exec record names no exec id: {exec}"))?;
        tagged(&mine, process, &call)?;
        ensure!(
            net_to(&mine, REGISTRY_HOST, "allow") && net_to(&mine, COLLECTOR_HOST, "deny"),
            "audit {member} does not show the pod's network records: {mine:#?}"
        );
        ensure!(
            mine.iter().any(|r| r["kind"] == "net"
                && r["sandbox"] == pod_id.as_str()
                && r["data"]["host"] == REGISTRY_HOST
                && r["data"]["tool_call_id"] == net_call.as_str()),
            "the pod's record of the container's fetch does not name its tool call {net_call}: {mine:#?}"
        );
        let text = harness::runtime_ok(&["audit", &member])?;
        ensure!(
            text.stdout.contains("# the pod's network records")
                && text.stdout.contains(COLLECTOR_HOST),
            "{text}"
        );
        let pods = records(&pod_name)?;
        ensure!(
            pods.iter().all(|r| r["sandbox"] == pod_id.as_str())
                && net_to(&pods, REGISTRY_HOST, "allow")
                && net_to(&pods, COLLECTOR_HOST, "deny"),
            "audit {pod_name} is not the pod's log with its network records: {pods:#?}"
        );
        if live {
            let layers = harness::runtime_ok(&["layers", &member])?;
            ensure!(layers.stdout.contains("\"running\""), "{layers}");
        }
        Ok(())
    };
    check(true)?;
    pod.remove()?;
    // Ended: the kept names, the pod link and the change set outlive the pod.
    check(false)?;
    let discarded = harness::runtime_ok(&["changes", "discard", &member])?;
    ensure!(discarded.stdout.contains(&id[..12]), "{discarded}");
    ensure!(
        !ws.path().join("cri.txt").exists(),
        "the sandbox's write reached the host workspace"
    );
    let k8s_root = format!("{}/k8s.io", ctr::RUNTIME_ROOT);
    for ended in [&id, &pod_id] {
        let _ = harness::runtime(&["--root", &k8s_root, "audit", "prune", ended]);
    }
    Ok(())
}

/// A pod's one proxy writes every container's connections into the pod sandbox's log; each
/// `net` record names the member container whose process opened it (found from the host:
/// socket inode, its holders, their cgroup), so `audit POD/CONTAINER` shows that
/// container's connections only, while `audit POD` shows all of them. Two containers of
/// one pod each fetch once, from a path of their own.
#[test]
fn cri_pod_net_records_name_the_member_container_that_connected() -> anyhow::Result<()> {
    net::ensure_test_hosts()?;
    let cri = Cri::connect()?;
    cri.require_image(PAUSE_IMAGE)?;
    cri.require_image(TOOLS_IMAGE)?;
    let registry = HttpServer::start(REGISTRY_IP, "names-members")?;
    let pod_name = harness::unique("nm", "two");
    let pod = Pod::run(&cri, pod_config(&pod_name, &[]), &cri::e2e_handler()?)?;
    let mut ids = Vec::new();
    for name in ["left", "right"] {
        let config = container_config(name, TOOLS_IMAGE, &["sleep", "3600"], &[]);
        let id = pod.start(&config)?;
        let fetch = format!(
            "curl -sS -m 15 -o /dev/null -w '%{{http_code}}' http://{REGISTRY_HOST}:{}/from-{name}",
            registry.port()
        );
        let out = cri.exec_sync(&id, &["sh", "-c", &fetch], 30)?;
        ensure!(out.stdout.contains("200"), "{name}: {}", out.output());
        ids.push((name, id));
    }
    let fetched = |rs: &[Value], name: &str| {
        rs.iter()
            .filter(|r| r["kind"] == "net" && r["data"]["path"] == format!("/from-{name}"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let pods = records(&pod_name)?;
    for (name, id) in &ids {
        let all = fetched(&pods, name);
        ensure!(
            all.len() == 1 && all[0]["data"]["container"] == id.as_str(),
            "the pod's record of {name}'s fetch does not name {id}: {pods:#?}"
        );
        let key = format!("{pod_name}/{name}");
        let mine = records(&key)?;
        let other = if *name == "left" { "right" } else { "left" };
        ensure!(
            fetched(&mine, name).len() == 1 && fetched(&mine, other).is_empty(),
            "audit {key} does not show exactly its own connection: {mine:#?}"
        );
        ensure!(
            mine.iter()
                .filter(|r| r["kind"] == "net")
                .all(|r| r["data"]["container"] == id.as_str()),
            "audit {key} shows another container's connection: {mine:#?}"
        );
        let text = harness::runtime_ok(&["audit", &key])?;
        ensure!(
            text.stdout.contains(&format!("/from-{name}"))
                && !text.stdout.contains(&format!("/from-{other}")),
            "{text}"
        );
    }
    let pod_id = pod.id.clone();
    pod.remove()?;
    let k8s_root = format!("{}/k8s.io", ctr::RUNTIME_ROOT);
    for ended in ids.iter().map(|(_, id)| id).chain([&pod_id]) {
        let _ = harness::runtime(&["--root", &k8s_root, "audit", "prune", ended]);
    }
    Ok(())
}

#[test]
fn ctr_exec_id_names_the_tool_call_of_the_exec_and_exit_records() -> anyhow::Result<()> {
    ctr::require_containerd()?;
    let ws = workspace()?;
    let id = ctr::unique_id("nm-ctr");
    let mount = format!(
        "type=bind,src={},dst=/workspace,options=rbind:rw",
        ws.path().display()
    );
    let (c, _) = Container::sleeping(Shim::AgentSandbox, &["--mount", &mount], &id)?;
    let out = c.task_cmd(
        &["exec", "--exec-id", "call-7"],
        &["sh", "-c", "echo x > /workspace/ctr.txt; exit 3"],
    )?;
    ensure!(out.code == Some(3), "{out}");
    // The argv form wins over the exec id, and the program never sees the prefix.
    let assignment = format!("{TOOL_CALL_ENV}=toolu_over");
    let out = c.task_cmd(
        &["exec", "--exec-id", "call-8"],
        &[
            "env",
            &assignment,
            "sh",
            "-c",
            "echo $0 $AGENT_SANDBOX_TOOL_CALL_ID",
        ],
    )?;
    ensure!(out.stdout.trim() == "sh toolu_over", "{out}");
    let rs = records(&id)?;
    tagged(&rs, "call-7", "call-7")?;
    tagged(&rs, "call-8", "toolu_over")?;
    let (_, exit) = exec_and_exit(&rs, "call-7");
    ensure!(
        exit.is_some_and(|e| e["data"]["status"]["code"] == 3),
        "the exit record of call-7 lost its code: {exit:?}"
    );
    reviewable(&id, &id, "ctr.txt", ws.path())?;
    drop(c);
    reviewable(&id, &id, "ctr.txt", ws.path())?;
    harness::runtime_ok(&["changes", "discard", &id])?;
    let ns_root = format!("{}/{}", ctr::RUNTIME_ROOT, ctr::NAMESPACE);
    let _ = harness::runtime(&["--root", &ns_root, "audit", "prune", &id]);
    Ok(())
}

#[test]
fn podman_name_and_short_id_reach_every_command_and_a_twin_name_is_ambiguous() -> anyhow::Result<()>
{
    harness::require_podman_image(User::Root, TOOLS_IMAGE)?;
    ctr::require_containerd()?;
    let ws = workspace()?;
    let podman = Podman::new(User::Root, Runtime::AgentSandbox);
    let volume = format!("{}:/workspace", ws.path().display());
    let (guard, id) =
        podman.run_detached(&[], "nm", &["-v", &volume, TOOLS_IMAGE, "sleep", "600"])?;
    let name = guard.name.clone();
    let out = podman.run(&[
        "exec",
        "--env",
        &format!("{TOOL_CALL_ENV}=toolu_pod1"),
        &name,
        "sh",
        "-c",
        "echo p > /workspace/podman.txt",
    ])?;
    ensure!(out.success(), "{out}");
    // An id outside the rule is refused, naming the variable; the same exec runs under runc.
    let bad = podman.run(&[
        "exec",
        "--env",
        &format!("{TOOL_CALL_ENV}=a;b"),
        &name,
        "echo",
        "ran",
    ])?;
    ensure!(
        !bad.success() && !bad.stdout.contains("ran") && bad.stderr.contains(TOOL_CALL_ENV),
        "{bad}"
    );
    for key in [name.as_str(), &id[..12], id.as_str()] {
        reviewable(key, &id, "podman.txt", ws.path())?;
    }
    let rs = records(&name)?;
    let exec = rs
        .iter()
        .find(|r| r["kind"] == "exec" && r["data"]["tool_call_id"] == "toolu_pod1")
        .with_context(|| format!("no exec record tagged toolu_pod1: {rs:#?}"))?;
    let session = exec["data"]["process"].as_str().unwrap_or_default();
    ensure!(
        session.len() == 64 && session.bytes().all(|b| b.is_ascii_hexdigit()),
        "the exec record does not name podman's exec session: {exec}"
    );
    tagged(&rs, session, "toolu_pod1")?;

    // The attack: a ctr container whose id starts with the podman container's name. The
    // name alone no longer picks a sandbox; the error lists both, and full ids still work.
    let twin = format!("{name}-twin");
    let (twin_c, _) = Container::sleeping(Shim::AgentSandbox, &[], &twin)?;
    let miss = harness::runtime(&["diff", &name])?;
    ensure!(
        !miss.success()
            && miss.stderr.contains("names several sandboxes")
            && miss.stderr.contains(&id)
            && miss.stderr.contains(&twin),
        "a name that is also another sandbox's id prefix picked one\n{miss}"
    );
    reviewable(&id, &id, "podman.txt", ws.path())?;
    let twin_audit = harness::runtime_ok(&["audit", "verify", &twin])?;
    ensure!(
        twin_audit.stdout.contains(&format!("{twin}.jsonl")),
        "{twin_audit}"
    );
    drop(twin_c);

    podman.run_ok(&["rm", "-f", "-t", "0", &name])?;
    drop(guard);
    for key in [&id[..12], id.as_str()] {
        reviewable(key, &id, "podman.txt", ws.path())?;
    }
    harness::runtime_ok(&["changes", "discard", &id])?;
    // Pruned by the names the engines showed, without --root: the twin lives in ctr's state
    // root, the podman sandbox is named by its short id.
    let twin_log = format!(
        "{}/{}/audit/{twin}.jsonl",
        ctr::RUNTIME_ROOT,
        ctr::NAMESPACE
    );
    for key in [twin.as_str(), &id[..12]] {
        let pruned = harness::runtime_ok(&["audit", "prune", key])?;
        ensure!(pruned.stdout.contains("1 removed"), "{pruned}");
    }
    ensure!(
        !Path::new(&twin_log).exists(),
        "{twin_log} is still there after its prune"
    );
    Ok(())
}

#[test]
fn docker_short_id_reaches_review_and_audit_after_promote_and_rm_without_root() -> anyhow::Result<()>
{
    docker::require_ready(TOOLS_IMAGE)?;
    let ws = workspace()?;
    let name = docker::unique_name("nm");
    let guard = docker::ContainerGuard { name: name.clone() };
    let volume = format!("{}:/workspace", ws.path().display());
    Docker::new(docker::Runtime::AgentSandbox).run_ok(&[
        "-d",
        "--name",
        &name,
        "-v",
        &volume,
        TOOLS_IMAGE,
        "sleep",
        "600",
    ])?;
    let id = full_id(&name)?;
    let short = &id[..12];
    docker_ok(&[
        "exec",
        "-e",
        &format!("{TOOL_CALL_ENV}=toolu_dk1"),
        &name,
        "sh",
        "-c",
        "echo d > /workspace/docker.txt",
    ])?;
    reviewable(short, &id, "docker.txt", ws.path())?;
    docker_ok(&["rm", "-f", &name])?;
    drop(guard);
    reviewable(short, &id, "docker.txt", ws.path())?;
    // A complete promote of the ended container discards its change set (the one record
    // that named dockerd's state root); the log is still found by the short id, with no flag.
    let promoted =
        harness::runtime_ok(&["promote", "--to", &ws.path().display().to_string(), short])?;
    ensure!(
        ws.path().join("docker.txt").is_file()
            && promoted.stdout.contains("promoted and discarded"),
        "{promoted}"
    );
    for key in [short, id.as_str()] {
        let out = harness::runtime_ok(&["audit", "verify", key])?;
        ensure!(out.stdout.contains(&format!("{id}.jsonl")), "{out}");
    }
    let rs = records(short)?;
    ensure!(
        rs.iter()
            .any(|r| r["kind"] == "exec" && r["data"]["tool_call_id"] == "toolu_dk1"),
        "no exec record tagged toolu_dk1: {rs:#?}"
    );
    ensure!(
        rs.iter().any(|r| r["kind"] == "promoted"),
        "no promoted record: {rs:#?}"
    );
    // dockerd never passes the container's name to the runtime (docs/audit.md): a miss.
    let miss = harness::runtime(&["audit", &name])?;
    ensure!(
        !miss.success() && miss.stderr.contains("no sandbox"),
        "{miss}"
    );
    let _ = harness::runtime(&[
        "--root",
        &docker::sandbox_root().display().to_string(),
        "audit",
        "prune",
        &id,
    ]);
    Ok(())
}
