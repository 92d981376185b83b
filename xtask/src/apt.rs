//! The Debian/Ubuntu packages the build and the runtime need.

use std::process::Command;

use anyhow::{bail, Result};

/// cmake and clang build whisper.cpp (bindgen needs libclang); espeak-ng gives the voice its
/// phonemes; npm and pip fetch the packages the models ship in; ALSA's headers build the
/// microphone demo (cpal), and PulseAudio with ALSA's plugin for it is the sound server its
/// test plays into; Chromium runs the live page's test (headless, driven by puppeteer-core).
const PACKAGES: &[&str] = &[
    "cmake",
    "clang",
    "libclang-dev",
    "espeak-ng",
    "libespeak-ng-dev",
    "python3-pip",
    "python3-venv",
    "npm",
    "pkg-config",
    "libasound2-dev",
    "pulseaudio",
    "pulseaudio-utils",
    "libasound2-plugins",
    "chromium",
];

/// Tools that may come from elsewhere than Debian (pyenv's pip, nvm's npm): only the
/// package is required when the tool is missing.
const SATISFIED_BY_TOOL: &[(&str, &[&str])] = &[
    ("python3-pip", &["python3", "-m", "pip", "--version"]),
    ("python3-venv", &["python3", "-c", "import venv, ensurepip"]),
    ("npm", &["npm", "--version"]),
];

fn installed(package: &str) -> bool {
    if let Some((_, probe)) = SATISFIED_BY_TOOL.iter().find(|(p, _)| *p == package) {
        if Command::new(probe[0])
            .args(&probe[1..])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return true;
        }
    }
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

pub fn ensure_packages() -> Result<()> {
    if Command::new("dpkg-query")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "setup: not a Debian-like system; make sure these are installed: {}",
            PACKAGES.join(" ")
        );
        return Ok(());
    }
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        eprintln!("setup: system packages present");
        return Ok(());
    }
    let line = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !is_root() {
        bail!("missing system packages; run as root:\n  sudo apt-get update && sudo {line}");
    }
    eprintln!("setup: installing {}", missing.join(" "));
    let apt = |args: &[&str]| -> Result<()> {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?;
        if !status.success() {
            bail!(
                "apt-get {} failed ({status}); run it by hand:\n  apt-get update && {line}",
                args.join(" ")
            );
        }
        Ok(())
    };
    apt(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(&missing);
    apt(&args)
}
