//! The official client libraries the tests drive Sublet with, in a Python virtual
//! environment and a Node package folder inside the cache, so nothing is installed into
//! the system's Python or Node.

use std::process::Command;

use anyhow::{bail, Context, Result};
use sublet_models::{ModelCache, NODE_ENV, NODE_PACKAGES, PYTHON_ENV, PYTHON_PACKAGES};

pub fn ensure_python_env(cache: &ModelCache) -> Result<()> {
    let dir = cache.path(PYTHON_ENV);
    let stamp = dir.join("sublet-packages.txt");
    let wanted = PYTHON_PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted)
        && dir.join("bin/python").is_file()
    {
        eprintln!("setup: test clients ok ({})", PYTHON_PACKAGES.join(", "));
        return Ok(());
    }
    eprintln!("setup: installing test clients into {}", dir.display());
    if !dir.join("bin/python").is_file() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&dir)
            .status()
            .context("running python3 -m venv: is Python 3 installed?")?;
        if !status.success() {
            bail!(
                "python3 -m venv {} failed ({status}); on Debian install python3-venv",
                dir.display()
            );
        }
    }
    let status = Command::new(dir.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(PYTHON_PACKAGES)
        .status()?;
    if !status.success() {
        bail!(
            "pip could not install {} ({status})",
            PYTHON_PACKAGES.join(" ")
        );
    }
    std::fs::write(stamp, wanted)?;
    Ok(())
}

pub fn ensure_node_env(cache: &ModelCache) -> Result<()> {
    let dir = cache.path(NODE_ENV);
    let stamp = dir.join("sublet-packages.txt");
    let wanted = NODE_PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) && cache.node_modules().is_ok() {
        eprintln!("setup: node test clients ok ({})", NODE_PACKAGES.join(", "));
        return Ok(());
    }
    eprintln!("setup: installing node test clients into {}", dir.display());
    std::fs::create_dir_all(&dir)?;
    let status = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--prefix",
        ])
        .arg(&dir)
        .args(NODE_PACKAGES)
        .status()
        .context("running npm: is npm installed?")?;
    if !status.success() {
        bail!(
            "npm could not install {} ({status})",
            NODE_PACKAGES.join(" ")
        );
    }
    std::fs::write(stamp, wanted)?;
    Ok(())
}
