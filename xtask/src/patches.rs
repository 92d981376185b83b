//! The project's patch series on mistral.rs, candle and whisper.cpp (in whisper-rs-sys),
//! carried the way make-room is carried on vLLM.
//!
//! `patches/<crate>/*.patch` are the project's own commits against the crate's published
//! source. Setup unpacks that source from cargo's registry cache into
//! `patched/<crate>` (git-ignored) as a git repository whose first commit, tagged
//! `published`, is the crate as released, and applies each patch as one commit on top;
//! the workspace builds it through `[patch.crates-io]`.
//!
//! To change a patch: edit `patched/<crate>`, commit (or amend the patch's commit), then
//! `cargo xtask patches save` writes the series back from `published..HEAD`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::repo_root;

/// The crates carried with patches, and their published versions.
const PATCHED: &[(&str, &str)] = &[
    ("mistralrs-core", "0.8.1"),
    ("candle-core", "0.10.2"),
    ("whisper-rs-sys", "0.15.0"),
];

fn git(dir: &Path) -> Command {
    let mut command = Command::new("git");
    command
        .current_dir(dir)
        .args([
            "-c",
            "user.name=sublet",
            "-c",
            "user.email=sublet@localhost",
            "-c",
            "commit.gpgsign=false",
        ])
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z");
    command
}

/// Runs git in `dir` with `args`; returns its output.
pub(crate) fn git_run<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) -> Result<String> {
    let mut command = git(dir);
    command.args(args);
    let what = format!(
        "git {}",
        args.first()
            .map_or(String::new(), |a| a.as_ref().to_string_lossy().into_owned())
    );
    output_of(command, &what)
}

/// Runs `command` (`what`, for errors); returns its standard output, or its standard
/// error as the error.
pub(crate) fn output_of(mut command: Command, what: &str) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn patch_files(name: &str) -> Result<Vec<PathBuf>> {
    let dir = repo_root().join("patches").join(name);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "patch"))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    Ok(files)
}

/// A fingerprint of the series, so setup re-applies it only when it changed.
fn series_hash(name: &str, version: &str) -> Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(format!("{name} {version}\n"));
    for file in patch_files(name)? {
        hasher.update(
            file.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .as_bytes(),
        );
        hasher.update(std::fs::read(&file)?);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// The published `.crate` from cargo's cache, fetched by cargo if it is not there yet.
fn published_crate(name: &str, version: &str) -> Result<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo")
        });
    let find = || -> Option<PathBuf> {
        let registries = std::fs::read_dir(cargo_home.join("registry/cache")).ok()?;
        registries
            .filter_map(|r| r.ok())
            .map(|r| r.path().join(format!("{name}-{version}.crate")))
            .find(|p| p.is_file())
    };
    if let Some(path) = find() {
        return Ok(path);
    }
    eprintln!("setup: fetching {name} {version} from the crate registry");
    let scratch = repo_root().join("patched/.fetch");
    std::fs::create_dir_all(scratch.join("src"))?;
    std::fs::write(
        scratch.join("Cargo.toml"),
        format!("[package]\nname = \"fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[workspace]\n\n[dependencies]\n{name} = \"={version}\"\n"),
    )?;
    std::fs::write(scratch.join("src/lib.rs"), "")?;
    let mut fetch = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    fetch
        .arg("fetch")
        .arg("--manifest-path")
        .arg(scratch.join("Cargo.toml"));
    output_of(fetch, "cargo fetch")?;
    find().with_context(|| {
        format!(
            "cargo fetched {name} {version} but its .crate is not in {}",
            cargo_home.display()
        )
    })
}

/// Unpacks and patches every carried crate whose series changed since the last setup.
pub fn ensure_patched() -> Result<()> {
    for &(name, version) in PATCHED {
        let dir = repo_root().join("patched").join(name);
        let stamp = repo_root().join("patched").join(format!("{name}.series"));
        let hash = series_hash(name, version)?;
        if dir.join(".git").is_dir() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == hash) {
            eprintln!(
                "setup: patched/{name} ok ({} patches)",
                patch_files(name)?.len()
            );
            continue;
        }
        if dir.join(".git").is_dir() {
            let status = git_run(&dir, &["status", "--porcelain"])?;
            let local = git_run(&dir, &["rev-list", "--count", "published..HEAD"])?;
            let expected = patch_files(name)?.len().to_string();
            if !status.trim().is_empty() || (stamp.is_file() && local.trim() != expected) {
                bail!(
                    "patched/{name} has edits that are not in patches/{name}: run `cargo xtask patches save` \
                     to keep them, or remove patched/{name} to start again from the series"
                );
            }
        }
        eprintln!("setup: applying patches/{name} to {name} {version}");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let archive = published_crate(name, version)?;
        let mut tar =
            tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(&archive)?));
        for entry in tar.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.into_owned();
            // `<name>-<version>/…` inside the archive.
            let inner: PathBuf = path.components().skip(1).collect();
            if inner.as_os_str().is_empty() {
                continue;
            }
            let target = dir.join(&inner);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            entry.unpack(&target)?;
        }
        for args in [
            vec!["init", "-q"],
            vec!["add", "-A", "-f"],
            vec![
                "commit",
                "-q",
                "-m",
                &format!("{name} {version} as published"),
            ],
            vec!["tag", "published"],
        ] {
            git_run(&dir, &args)?;
        }
        for patch in patch_files(name)? {
            let mut c = git(&dir);
            c.args(["am", "-q", "--keep-cr"]).arg(&patch);
            output_of(c, &format!("git am {}", patch.display())).with_context(|| {
                format!("{} does not apply to {name} {version}", patch.display())
            })?;
        }
        std::fs::write(&stamp, hash)?;
    }
    Ok(())
}

/// Writes each carried crate's series back from its `published..HEAD` commits.
pub fn save() -> Result<()> {
    for &(name, version) in PATCHED {
        let dir = repo_root().join("patched").join(name);
        if !dir.join(".git").is_dir() {
            bail!("patched/{name} does not exist: run `cargo xtask setup` first");
        }
        let status = git_run(&dir, &["status", "--porcelain"])?;
        if !status.trim().is_empty() {
            bail!("patched/{name} has uncommitted edits; commit them first (one commit per patch)");
        }
        let out = repo_root().join("patches").join(name);
        std::fs::create_dir_all(&out)?;
        for old in patch_files(name)? {
            std::fs::remove_file(old)?;
        }
        let mut c = git(&dir);
        c.args([
            "format-patch",
            "-q",
            "--zero-commit",
            "--no-signature",
            "--no-stat",
            "-o",
        ])
        .arg(&out)
        .arg("published..HEAD");
        output_of(c, "git format-patch")?;
        let count = patch_files(name)?.len();
        std::fs::write(
            repo_root().join("patched").join(format!("{name}.series")),
            series_hash(name, version)?,
        )?;
        eprintln!("patches: wrote {count} patches to patches/{name}");
    }
    Ok(())
}
