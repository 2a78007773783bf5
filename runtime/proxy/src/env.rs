//! The environment that points a sandbox's tools at the proxy.
//!
//! One port serves HTTP proxying and SOCKS5, so every variable names the same
//! `127.0.0.1:PORT`. Tools that ignore all of these (raw sockets without a proxy setting) simply
//! cannot reach the network: the sandbox has no other route out.
//!
//! Git over ssh: OpenSSH has no built-in SOCKS or HTTP proxy client, so `GIT_SSH_COMMAND` runs
//! ssh with a `ProxyCommand`, and the image must ship the program it names (HTTPS git needs
//! none). What is commonly there:
//! - Debian's `netcat-openbsd` (`nc -X 5 -x host:port`, SOCKS5): the default. Not in the
//!   `debian`/`ubuntu` base images; busybox `nc` has no proxy support at all.
//! - `bash` (in every Debian/Ubuntu image, not in busybox/alpine): [`SshProxyTool::Bash`] opens
//!   `/dev/tcp/127.0.0.1/PORT`, sends `CONNECT`, checks the `200` and relays with `cat`.
//! - `socat` ([`SshProxyTool::Socat`], HTTP CONNECT: Debian 12's socat 1.7 has no SOCKS5) and
//!   nmap's `ncat` ([`SshProxyTool::Ncat`]).
//!
//! With nc and bash, a server that hangs up without an SSH disconnect message leaves ssh waiting
//! until the user interrupts it (the relay keeps ssh's side open while ssh's stdin is open); a
//! normal SSH session end is unaffected.

/// The program ssh's `ProxyCommand` runs to reach the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SshProxyTool {
    /// `nc -X 5 -x 127.0.0.1:PORT %h %p` (Debian `netcat-openbsd`; `nc.openbsd` when present).
    #[default]
    OpenbsdNetcat,
    /// `socat - PROXY:127.0.0.1:%h:%p,proxyport=PORT` (HTTP CONNECT).
    Socat,
    /// `ncat --proxy 127.0.0.1:PORT --proxy-type socks5 %h %p` (nmap's ncat).
    Ncat,
    /// bash's `/dev/tcp` and `cat`, through HTTP CONNECT; needs nothing beyond bash and
    /// coreutils.
    Bash,
}

/// The `ProxyCommand` for ssh through the proxy on `port`.
pub fn ssh_proxy_command(port: u16, tool: SshProxyTool) -> String {
    match tool {
        // `nc.openbsd` first: in images whose /bin/sh is busybox built with standalone applets,
        // a bare `nc` runs busybox's nc (no proxy support) whatever PATH says.
        SshProxyTool::OpenbsdNetcat => {
            format!("$(command -v nc.openbsd || echo nc) -X 5 -x 127.0.0.1:{port} %h %p")
        }
        SshProxyTool::Socat => format!("socat - PROXY:127.0.0.1:%h:%p,proxyport={port}"),
        SshProxyTool::Ncat => {
            format!("ncat --proxy 127.0.0.1:{port} --proxy-type socks5 %h %p")
        }
        SshProxyTool::Bash => {
            // Host and port arrive as $1 and $2, never inside the script text. bash's `read`
            // takes a socket one byte at a time, so nothing after the response head is eaten.
            // `%%` is ssh's escape for a literal `%` in a ProxyCommand.
            let script = [
                format!("exec 3<>/dev/tcp/127.0.0.1/{port} || exit 1"),
                r#"printf "CONNECT %%s:%%s HTTP/1.1\r\nHost: %%s:%%s\r\n\r\n" "$1" "$2" "$1" "$2" >&3"#
                    .to_owned(),
                "IFS= read -r status <&3".to_owned(),
                r#"case "$status" in "HTTP/1."?" 200"*) ;; *) echo "agent-sandbox proxy: $1:$2: $status" >&2; exit 1 ;; esac"#
                    .to_owned(),
                r#"while IFS= read -r line <&3 && [ "${#line}" -gt 1 ]; do :; done"#.to_owned(),
                "cat <&3 & exec cat >&3".to_owned(),
            ]
            .join("; ");
            format!("bash -c '{script}' agent-sandbox-ssh %h %p")
        }
    }
}

/// Quotes `text` as one word for a POSIX shell.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Hosts that stay inside the sandbox and never go through the proxy.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The variables for a sandbox whose proxy listens on `127.0.0.1:port`, with git over ssh using
/// the default [`SshProxyTool`]. See [`proxy_env_with`].
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    proxy_env_with(port, SshProxyTool::default())
}

/// The variables for a sandbox whose proxy listens on `127.0.0.1:port`.
///
/// `GIT_CONFIG_COUNT`/`KEY_n`/`VALUE_n` are set from index 0; a caller merging them into an
/// environment that already has `GIT_CONFIG_COUNT` must renumber.
pub fn proxy_env_with(port: u16, ssh: SshProxyTool) -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    let mut env: Vec<(String, String)> = Vec::new();
    let mut both = |name: &str, value: &str| {
        env.push((name.to_ascii_uppercase(), value.to_owned()));
        env.push((name.to_ascii_lowercase(), value.to_owned()));
    };
    both("HTTP_PROXY", &http);
    both("HTTPS_PROXY", &http);
    both("ALL_PROXY", &socks);
    both("NO_PROXY", NO_PROXY);
    let java = [
        format!("-Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort={port}"),
        format!("-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort={port}"),
        "-Dhttp.nonProxyHosts=localhost|127.0.0.1|[::1]".to_owned(),
        format!("-DsocksProxyHost=127.0.0.1 -DsocksProxyPort={port} -DsocksProxyVersion=5"),
    ]
    .join(" ");
    let fixed = [
        // npm reads npm_config_* from the environment (lower case is what npm itself writes).
        ("npm_config_proxy", http.clone()),
        ("npm_config_https_proxy", http.clone()),
        ("npm_config_noproxy", NO_PROXY.to_owned()),
        ("PIP_PROXY", http.clone()),
        // git's http.proxy through environment-supplied config (git >= 2.31).
        ("GIT_CONFIG_COUNT", "1".to_owned()),
        ("GIT_CONFIG_KEY_0", "http.proxy".to_owned()),
        ("GIT_CONFIG_VALUE_0", http.clone()),
        // git runs this through `sh -c`; ssh then runs the ProxyCommand through `sh -c` too.
        (
            "GIT_SSH_COMMAND",
            format!(
                "ssh -o {}",
                sh_quote(&format!("ProxyCommand={}", ssh_proxy_command(port, ssh)))
            ),
        ),
        // Node >= 24 (and 22.21+) honour HTTP(S)_PROXY for http/https and fetch with this set.
        ("NODE_USE_ENV_PROXY", "1".to_owned()),
        ("JAVA_TOOL_OPTIONS", java),
    ];
    env.extend(fixed.into_iter().map(|(k, v)| (k.to_owned(), v)));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(env: &'a [(String, String)], key: &str) -> &'a str {
        let found: Vec<_> = env.iter().filter(|(k, _)| k == key).collect();
        assert_eq!(found.len(), 1, "{key} set {} times", found.len());
        &found[0].1
    }

    #[test]
    fn names_every_tool() {
        let env = proxy_env(3128);
        for key in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"] {
            assert_eq!(get(&env, key), "http://127.0.0.1:3128");
        }
        assert_eq!(get(&env, "ALL_PROXY"), "socks5h://127.0.0.1:3128");
        assert_eq!(get(&env, "all_proxy"), "socks5h://127.0.0.1:3128");
        assert_eq!(get(&env, "NO_PROXY"), "localhost,127.0.0.1,::1");
        assert_eq!(get(&env, "no_proxy"), "localhost,127.0.0.1,::1");
        assert_eq!(get(&env, "npm_config_proxy"), "http://127.0.0.1:3128");
        assert_eq!(get(&env, "npm_config_https_proxy"), "http://127.0.0.1:3128");
        assert_eq!(get(&env, "PIP_PROXY"), "http://127.0.0.1:3128");
        assert_eq!(get(&env, "GIT_CONFIG_COUNT"), "1");
        assert_eq!(get(&env, "GIT_CONFIG_KEY_0"), "http.proxy");
        assert_eq!(get(&env, "GIT_CONFIG_VALUE_0"), "http://127.0.0.1:3128");
        assert_eq!(get(&env, "NODE_USE_ENV_PROXY"), "1");
        assert_eq!(
            get(&env, "GIT_SSH_COMMAND"),
            "ssh -o 'ProxyCommand=$(command -v nc.openbsd || echo nc) -X 5 -x 127.0.0.1:3128 %h %p'"
        );
        let java = get(&env, "JAVA_TOOL_OPTIONS");
        for prop in [
            "-Dhttp.proxyHost=127.0.0.1",
            "-Dhttp.proxyPort=3128",
            "-Dhttps.proxyHost=127.0.0.1",
            "-Dhttps.proxyPort=3128",
            "-DsocksProxyHost=127.0.0.1",
            "-DsocksProxyPort=3128",
        ] {
            assert!(
                java.split(' ').any(|p| p == prop),
                "{prop} missing from {java}"
            );
        }
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn ssh_tools() {
        assert_eq!(
            ssh_proxy_command(1080, SshProxyTool::Socat),
            "socat - PROXY:127.0.0.1:%h:%p,proxyport=1080"
        );
        assert_eq!(
            ssh_proxy_command(1080, SshProxyTool::Ncat),
            "ncat --proxy 127.0.0.1:1080 --proxy-type socks5 %h %p"
        );
    }
}
