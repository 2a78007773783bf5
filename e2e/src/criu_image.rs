//! Edits of CRIU's image files, as a user holding an exported checkpoint could make them:
//! the attacks the checkpoint suites restore (e2e/tests/suite/checkpoint.rs, and in the VM
//! suite through examples/criu_edit.rs). CRIU's `*.img` files are protobuf messages; this
//! reads and writes the wire format field by field, so an edit keeps every field it does not
//! touch.

use std::path::Path;

use anyhow::{Context, bail, ensure};

/// One field of a protobuf message in wire form: its number and value.
#[derive(Debug, Clone)]
pub enum Field {
    Varint(u64, u64),
    Bytes(u64, Vec<u8>),
    Fixed64(u64, [u8; 8]),
    Fixed32(u64, [u8; 4]),
}

fn get_varint(buf: &[u8], at: &mut usize) -> anyhow::Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at).context("varint past the end")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    bail!("varint too long")
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(u8::try_from(v & 0x7f).unwrap_or_default() | 0x80);
        v >>= 7;
    }
    out.push(u8::try_from(v).unwrap_or_default());
}

fn parse(buf: &[u8]) -> anyhow::Result<Vec<Field>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < buf.len() {
        let key = get_varint(buf, &mut at)?;
        let (n, wire) = (key >> 3, key & 7);
        out.push(match wire {
            0 => Field::Varint(n, get_varint(buf, &mut at)?),
            2 => {
                let len = usize::try_from(get_varint(buf, &mut at)?)?;
                let v = buf
                    .get(at..at + len)
                    .context("bytes past the end")?
                    .to_vec();
                at += len;
                Field::Bytes(n, v)
            }
            1 => {
                let v = buf.get(at..at + 8).context("fixed64 past the end")?;
                at += 8;
                Field::Fixed64(n, v.try_into()?)
            }
            5 => {
                let v = buf.get(at..at + 4).context("fixed32 past the end")?;
                at += 4;
                Field::Fixed32(n, v.try_into()?)
            }
            w => bail!("wire type {w}"),
        });
    }
    Ok(out)
}

fn encode(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        match f {
            Field::Varint(n, v) => {
                put_varint(&mut out, n << 3);
                put_varint(&mut out, *v);
            }
            Field::Bytes(n, v) => {
                put_varint(&mut out, (n << 3) | 2);
                put_varint(&mut out, v.len() as u64);
                out.extend_from_slice(v);
            }
            Field::Fixed64(n, v) => {
                put_varint(&mut out, (n << 3) | 1);
                out.extend_from_slice(v);
            }
            Field::Fixed32(n, v) => {
                put_varint(&mut out, (n << 3) | 5);
                out.extend_from_slice(v);
            }
        }
    }
    out
}

/// Edits the `thread_core` (CoreEntry field 5) of CRIU's `core-PID.img`: the file is two
/// magic numbers, then one entry (a 32-bit size and the CoreEntry message). The edit a
/// user with the exported image could make.
pub fn edit_thread_core(path: &Path, edit: fn(Vec<Field>) -> Vec<Field>) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let size = u32::from_le_bytes(bytes[8..12].try_into()?) as usize;
    let mut core = parse(&bytes[12..12 + size])?;
    let mut found = false;
    for f in &mut core {
        if let Field::Bytes(5, tc) = f {
            *tc = encode(&edit(parse(tc)?));
            found = true;
        }
    }
    ensure!(found, "{} has no thread_core", path.display());
    let body = encode(&core);
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(&u32::try_from(body.len())?.to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&bytes[12 + size..]);
    std::fs::write(path, out)?;
    Ok(())
}

/// ThreadCoreEntry: `seccomp_mode` (11) disabled, no `seccomp_filter` (12).
pub fn drop_seccomp(mut tc: Vec<Field>) -> Vec<Field> {
    tc.retain(|f| !matches!(f, Field::Varint(11 | 12, _)));
    tc.push(Field::Varint(11, 0));
    tc
}

/// ThreadCoreEntry `creds` (10): CAP_SYS_ADMIN (21) in the permitted (10), effective (11)
/// and bounding (12) sets' low words.
pub fn add_sys_admin(mut tc: Vec<Field>) -> Vec<Field> {
    for f in &mut tc {
        if let Field::Bytes(10, creds) = f {
            let mut c = parse(creds).unwrap_or_default();
            for set in [10, 11, 12] {
                if let Some(Field::Varint(_, low)) = c
                    .iter_mut()
                    .find(|f| matches!(f, Field::Varint(n, _) if *n == set))
                {
                    *low |= 1 << 21;
                }
            }
            *creds = encode(&c);
        }
    }
    tc
}

/// Maps the sandbox's root to host root in CRIU's `userns-N.img` (a `UsernsEntry`: its
/// `uid_map` (1) and `gid_map` (2) extents, each `first` (1), `lower_first` (2), `count`
/// (3)): every extent's `lower_first` becomes 0. The edit a user with the image could make.
pub fn map_root_to_host_root(image: &Path) -> anyhow::Result<()> {
    let mut edited = 0;
    for entry in std::fs::read_dir(image)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !(name.starts_with("userns-") && name.ends_with(".img")) {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        let size = u32::from_le_bytes(bytes[8..12].try_into()?) as usize;
        let mut userns = parse(&bytes[12..12 + size])?;
        for f in &mut userns {
            if let Field::Bytes(1 | 2, extent) = f {
                let mut e = parse(extent)?;
                for g in &mut e {
                    if let Field::Varint(2, lower) = g {
                        *lower = 0;
                    }
                }
                *extent = encode(&e);
            }
        }
        let body = encode(&userns);
        let mut out = bytes[..8].to_vec();
        out.extend_from_slice(&u32::try_from(body.len())?.to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&bytes[12 + size..]);
        std::fs::write(&path, out)?;
        edited += 1;
    }
    ensure!(edited > 0, "{} has no userns image", image.display());
    Ok(())
}

/// A BPF program of one instruction, `BPF_RET | BPF_K` `SECCOMP_RET_ALLOW`: every syscall
/// allowed, as `struct sock_filter`s in native byte order (what CRIU stores).
pub fn allow_all_program() -> Vec<u8> {
    let mut out = 0x06u16.to_ne_bytes().to_vec();
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&0x7fff_0000u32.to_ne_bytes());
    out
}

/// Replaces the first-installed seccomp filter of every chain in CRIU's `seccomp.img` (a
/// `SeccompEntry`: `seccomp_filters` (1), each `filter` (1), `prev` (2), `flags` (3)) by
/// [`allow_all_program`]: the same count of filters, the first (the sandbox's own, under
/// runc podman's) allowing everything. CRIU writes a thread's filters newest first and each
/// `prev` names the one installed after it, so a first-installed filter is one that no
/// `prev` names. The edit a user with the image could make.
pub fn permit_all_first_filter(image: &Path) -> anyhow::Result<()> {
    let path = image.join("seccomp.img");
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let size = u32::from_le_bytes(bytes[8..12].try_into()?) as usize;
    let mut entry = parse(&bytes[12..12 + size])?;
    let mut named = Vec::new();
    for f in &entry {
        if let Field::Bytes(1, filter) = f {
            for g in parse(filter)? {
                if let Field::Varint(2, prev) = g {
                    named.push(prev);
                }
            }
        }
    }
    let mut edited = 0;
    let mut index = 0u64;
    for f in &mut entry {
        if let Field::Bytes(1, filter) = f {
            if !named.contains(&index) {
                let mut fields = parse(filter)?;
                for g in &mut fields {
                    if let Field::Bytes(1, program) = g {
                        *program = allow_all_program();
                        edited += 1;
                    }
                }
                *filter = encode(&fields);
            }
            index += 1;
        }
    }
    ensure!(edited > 0, "{} has no first filter", path.display());
    let body = encode(&entry);
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(&u32::try_from(body.len())?.to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&bytes[12 + size..]);
    std::fs::write(&path, out)?;
    Ok(())
}

/// Writes into the image's `agent-sandbox.json` the digest of its CRIU files as they are now
/// (the runtime's `image_digest`: each `*.img` by name order, as name, a zero byte, the
/// length as 8 little-endian bytes and the bytes, through SHA-256), as a user who edited
/// the files would, so that a restore gets past the digest to the checks of what the files
/// say. Hashed by `sha256sum`, the suite's own stand-in for the runtime's code.
pub fn reseal_digest(image: &Path) -> anyhow::Result<String> {
    use std::io::Write;
    let mut names: Vec<String> = std::fs::read_dir(image)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".img"))
        .collect();
    names.sort();
    let mut stream = Vec::new();
    for name in &names {
        let bytes = std::fs::read(image.join(name))?;
        stream.extend_from_slice(name.as_bytes());
        stream.push(0);
        stream.extend_from_slice(&u64::try_from(bytes.len())?.to_le_bytes());
        stream.extend_from_slice(&bytes);
    }
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run sha256sum")?;
    child
        .stdin
        .take()
        .context("no stdin for sha256sum")?
        .write_all(&stream)?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "sha256sum failed");
    let hex = String::from_utf8(out.stdout)?;
    let digest = format!(
        "sha256:{}",
        hex.split_whitespace().next().unwrap_or_default()
    );
    let path = image.join("agent-sandbox.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    manifest["image_digest"] = serde_json::Value::String(digest.clone());
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest)?)?;
    Ok(digest)
}

/// Drops the mount at `point` from the image's `mountpoints-N.img` (a header of two magic
/// numbers, then `MntEntry` messages, each after its 32-bit size; `mountpoint` is field 7),
/// as a user holding the image could to restore a sandbox without one of its masks.
pub fn drop_mount(image: &Path, point: &str) -> anyhow::Result<()> {
    let mut dropped = 0;
    for entry in std::fs::read_dir(image)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !(name.starts_with("mountpoints-") && name.ends_with(".img")) {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        ensure!(bytes.len() >= 8, "{} is too short", path.display());
        let mut out = bytes[..8].to_vec();
        let mut at = 8;
        while at + 4 <= bytes.len() {
            let size = u32::from_le_bytes(bytes[at..at + 4].try_into()?) as usize;
            let end = at + 4 + size;
            ensure!(end <= bytes.len(), "{} is truncated", path.display());
            let fields = parse(&bytes[at + 4..end])?;
            let here = fields.iter().any(|f| {
                matches!(f, Field::Bytes(7, v)
                    if String::from_utf8_lossy(v).trim_start_matches('.') == point)
            });
            if here {
                dropped += 1;
            } else {
                out.extend_from_slice(&bytes[at..end]);
            }
            at = end;
        }
        std::fs::write(&path, out)?;
    }
    ensure!(dropped > 0, "{} has no mount at {point}", image.display());
    Ok(())
}
