//! The commit a build is made from: its id and time, which the image and the release
//! set carry as their every timestamp.

use std::process::Command;

use anyhow::{Context, Result};

use crate::{toolchain::output, workspace_root};

/// What the commit says: its id and time (the set's every timestamp).
#[derive(Clone, Debug)]
pub(crate) struct Source {
    /// The commit id, with `-dirty` when the tree has uncommitted changes.
    pub revision: String,
    /// Seconds since the epoch: `SOURCE_DATE_EPOCH` when set, else the commit's time.
    pub epoch: u64,
}

impl Source {
    /// From git (the workspace), or from `SOURCE_DATE_EPOCH`.
    pub(crate) fn read() -> Result<Source> {
        let git = |args: &[&str]| {
            output(Command::new("git").current_dir(workspace_root()).args(args))
                .map(|s| s.trim().to_string())
        };
        let mut revision =
            git(&["rev-parse", "HEAD"]).context("the release needs a git checkout")?;
        let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
        if dirty {
            eprintln!(
                "xtask: warning: the tree has uncommitted changes: the set is not the commit's"
            );
            revision.push_str("-dirty");
        }
        let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(s) => s
                .parse()
                .with_context(|| format!("SOURCE_DATE_EPOCH={s:?}: expected seconds"))?,
            Err(_) => git(&["log", "-1", "--format=%ct"])?
                .parse()
                .context("git log printed no commit time")?,
        };
        Ok(Source { revision, epoch })
    }
}
