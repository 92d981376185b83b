//! The bundled models checked against their sha256 at every start, not only at fetch: a
//! file truncated by a full disk or changed after setup is refused before a call or a
//! request is taken. Hashing ~230 MB takes about a second here, so each file's size and
//! modification time are kept beside its hash once it matched (`.verified` in the cache);
//! a start whose files still have them hashes nothing.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::{Artifact, ModelCache, ARTIFACTS};

/// The cache file that keeps the files already found matching.
const STAMPS: &str = ".verified";

/// A bundled model whose bytes are not the ones setup fetched.
#[derive(Debug)]
pub struct CorruptModel {
    pub path: PathBuf,
    /// What it hashes to (or why it could not be read).
    pub found: String,
    pub expected: &'static str,
}

impl fmt::Display for CorruptModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "model file {} is not the one setup fetched (sha256 {}, expected {}): remove it and run `cargo xtask setup` again",
            self.path.display(),
            self.found,
            self.expected
        )
    }
}

impl std::error::Error for CorruptModel {}

/// What a file looked like when it last matched: its size and modification time (ns).
fn stamp_of(path: &Path) -> Option<(u64, u128)> {
    let meta = fs::metadata(path).ok()?;
    let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some((meta.len(), modified.as_nanos()))
}

/// A file's sha256, as hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// The stamps kept: file → (sha256, size, mtime).
fn read_stamps(path: &Path) -> HashMap<String, (String, u64, u128)> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(4, ' ');
            let sha = parts.next()?.to_owned();
            let size = parts.next()?.parse().ok()?;
            let mtime = parts.next()?.parse().ok()?;
            Some((parts.next()?.to_owned(), (sha, size, mtime)))
        })
        .collect()
}

impl ModelCache {
    /// Checks each bundled model this process will open (those the user did not replace)
    /// against its sha256, hashing only files changed since they last matched.
    pub fn verify_bundled(&self) -> Result<(), CorruptModel> {
        let stamps_path = self.path(STAMPS);
        let mut stamps = read_stamps(&stamps_path);
        let mut changed = false;
        for artifact in ARTIFACTS.iter().filter(|a| self.opens(a)) {
            let path = self.path(artifact.file);
            let Some((size, mtime)) = stamp_of(&path) else {
                // Missing: the runtime's own `require` says so, with how to get it.
                continue;
            };
            let kept = stamps.get(artifact.file);
            if kept.is_some_and(|(sha, s, m)| sha == artifact.sha256 && (*s, *m) == (size, mtime)) {
                continue;
            }
            let found = sha256_file(&path).unwrap_or_else(|e| format!("unreadable: {e}"));
            if found != artifact.sha256 {
                stamps.remove(artifact.file);
                write_stamps(&stamps_path, &stamps);
                return Err(CorruptModel {
                    path,
                    found,
                    expected: artifact.sha256,
                });
            }
            stamps.insert(artifact.file.to_owned(), (found, size, mtime));
            changed = true;
        }
        if changed {
            write_stamps(&stamps_path, &stamps);
        }
        Ok(())
    }

    /// Whether this process opens `artifact` (a bundled model the user did not replace).
    fn opens(&self, artifact: &Artifact) -> bool {
        let choice = self.choice();
        artifact.checked_at_start
            && !(artifact.file.starts_with("llm/") && choice.llm.is_some())
            && !(artifact.file.starts_with("tts/") && choice.voice.is_some())
    }
}

/// Writes the stamps through a temporary file, so that a process starting beside this
/// one reads the old ones or the new ones, never half; a cache that cannot be written
/// (read-only) only means hashing again next time.
fn write_stamps(path: &Path, stamps: &HashMap<String, (String, u64, u128)>) {
    let mut lines: Vec<String> = stamps
        .iter()
        .map(|(file, (sha, size, mtime))| format!("{sha} {size} {mtime} {file}\n"))
        .collect();
    lines.sort();
    let temporary = path.with_extension(format!("{}", std::process::id()));
    if fs::write(&temporary, lines.concat()).is_ok() && fs::rename(&temporary, path).is_err() {
        let _ = fs::remove_file(&temporary);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache holding the bundled voice's config, with its real bytes or others.
    fn cache_with(bytes: &[u8]) -> (ModelCache, PathBuf) {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("sublet-verify-{}-{n}", std::process::id()));
        let artifact = ARTIFACTS
            .iter()
            .find(|a| a.file.ends_with(".onnx.json"))
            .unwrap();
        let path = root.join(artifact.file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, bytes).unwrap();
        (ModelCache::at(&root), path)
    }

    #[test]
    fn a_changed_model_is_refused_and_an_unchanged_one_is_not_hashed_again() {
        let real = ModelCache::from_env().path("tts/en_US-joe-medium.onnx.json");
        let Ok(bytes) = fs::read(&real) else {
            panic!("{} is missing: run `cargo xtask setup`", real.display());
        };
        let (cache, path) = cache_with(&bytes);
        cache.verify_bundled().unwrap();
        let stamps = fs::read_to_string(cache.path(STAMPS)).unwrap();
        assert!(
            stamps.contains("tts/en_US-joe-medium.onnx.json"),
            "{stamps}"
        );
        // One byte changed, same size: the stamp's mtime no longer matches, so it is hashed.
        let mut changed = bytes.clone();
        changed[0] ^= 1;
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(&path, &changed).unwrap();
        let refused = cache.verify_bundled().unwrap_err();
        assert_eq!(refused.path, path);
        assert!(
            refused.to_string().contains("cargo xtask setup"),
            "{refused}"
        );
        // Still refused on the next start: a failed file keeps no stamp.
        assert!(cache.verify_bundled().is_err());
        // Truncated, too.
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(cache.verify_bundled().is_err());
        // Restored, it passes again.
        fs::write(&path, &bytes).unwrap();
        cache.verify_bundled().unwrap();
        let _ = fs::remove_dir_all(cache.root());
    }

    #[test]
    fn a_stamp_that_matches_spares_the_hash() {
        let (cache, path) = cache_with(b"not the voice's config");
        let (size, mtime) = stamp_of(&path).unwrap();
        let artifact = ARTIFACTS
            .iter()
            .find(|a| a.file.ends_with(".onnx.json"))
            .unwrap();
        // A stamp claiming it matched: trusted while size and time are the same.
        let stamps = HashMap::from([(
            artifact.file.to_owned(),
            (artifact.sha256.to_owned(), size, mtime),
        )]);
        write_stamps(&cache.path(STAMPS), &stamps);
        cache.verify_bundled().unwrap();
        // Touched: hashed, and refused.
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(&path, b"not the voice's config").unwrap();
        assert!(cache.verify_bundled().is_err());
        let _ = fs::remove_dir_all(cache.root());
    }
}
