//! Mount helpers: real tmpfs and overlay mounts, unmounted on drop.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

pub struct Mounted {
    pub target: PathBuf,
    mounted: bool,
}

impl Mounted {
    pub fn tmpfs(target: &Path, size: &str) -> Result<Self> {
        mount(
            Some("tmpfs"),
            target,
            Some("tmpfs"),
            MsFlags::empty(),
            Some(format!("size={size},mode=0755").as_str()),
        )
        .with_context(|| format!("mount tmpfs on {} (tests need root)", target.display()))?;
        Ok(Mounted {
            target: target.to_owned(),
            mounted: true,
        })
    }

    pub fn overlay(
        lower: &Path,
        upper: &Path,
        work: &Path,
        target: &Path,
        extra: &str,
    ) -> Result<Self> {
        let mut opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        if !extra.is_empty() {
            opts.push(',');
            opts.push_str(extra);
        }
        mount(
            Some("overlay"),
            target,
            Some("overlay"),
            MsFlags::empty(),
            Some(opts.as_str()),
        )
        .with_context(|| {
            format!(
                "mount overlay ({opts}) on {} (tests need root)",
                target.display()
            )
        })?;
        Ok(Mounted {
            target: target.to_owned(),
            mounted: true,
        })
    }

    pub fn unmount(&mut self) -> Result<()> {
        if self.mounted {
            umount2(&self.target, MntFlags::empty())
                .with_context(|| format!("umount {}", self.target.display()))?;
            self.mounted = false;
        }
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = umount2(&self.target, MntFlags::MNT_DETACH);
        }
    }
}
