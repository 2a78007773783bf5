//! What this host supports, for the layer plan (`agent_sandbox_policy::plan::layers_for`).

use agent_sandbox_policy::layers::HostSupport;

/// What the host supports, measured. Landlock's ABI comes from the kernel's own version
/// query (`agent_sandbox_sys::landlock_abi`), the one probe every part of the runtime uses.
pub fn host_support() -> HostSupport {
    HostSupport {
        seccomp: std::fs::read_to_string("/proc/self/status")
            .map(|s| s.contains("Seccomp:"))
            .unwrap_or(false),
        landlock_abi: agent_sandbox_sys::landlock_abi().unwrap_or(0),
        apparmor: crate::host::apparmor::host(),
        cgroups: crate::host::cgroups::available(&crate::host::cgroups::RealHost),
    }
}
