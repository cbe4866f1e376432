//! The token cache: the token ids of a text's training and validation splits, encoded once per
//! tokenizer and kept in a folder keyed by the tokenizer's sha256.
//!
//! ```text
//! <folder of the text>/tokens-<first 16 hex of the tokenizer's sha256>/
//!     train.u16 (or .u32), val.u16 (or .u32), MANIFEST
//! ```
//!
//! Token files are headerless little-endian integers: `u16` when every id of the tokenizer is
//! below 65 536, else `u32`. `MANIFEST` names the text (a corpus's name, or the source hash of
//! the user's own text), the tokenizer's full sha256, the width, and each file's token count and
//! sha256; a load checks all of them. What a damaged folder leads to is the caller's
//! [`OnDamage`]: encoded again with a warning (a corpus) or refused (the user's own text).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::tokenizer::TextTokenizer;
use crate::data::registry::{write_synced, TempFolder};
use crate::data::DataError;

/// The manifest of a token-cache folder.
pub const TOKEN_MANIFEST: &str = "MANIFEST";

/// The two splits of a token cache, by file stem.
const SPLITS: [&str; 2] = ["train", "val"];

/// What a load does with a token-cache folder that is there but fails its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDamage {
    /// Log a warning naming the problem and encode the text again (the registry corpora: their
    /// text is pinned and verified, so the new encoding is the old one).
    Rebuild,
    /// Refuse with an error naming the file, what is wrong and the folder to delete to encode
    /// again (the user's own text).
    Refuse,
}

/// The token-cache folder of `tokenizer` in the text's folder `dir`.
pub fn token_cache_dir(dir: &Path, tokenizer_sha256: &str) -> PathBuf {
    let key = tokenizer_sha256.get(..16).unwrap_or(tokenizer_sha256);
    dir.join(format!("tokens-{key}"))
}

/// The bytes per token id of a tokenizer with `vocab_size` ids: 2 up to 65 536, else 4.
pub fn token_width(vocab_size: usize) -> usize {
    if vocab_size <= 1 << 16 {
        2
    } else {
        4
    }
}

fn token_file_name(split: &str, width: usize) -> String {
    format!("{split}.u{}", width * 8)
}

/// Little-endian bytes of `ids`, `width` (2 or 4) bytes each.
pub(super) fn ids_to_bytes(ids: &[u32], width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * width);
    for &id in ids {
        if width == 2 {
            // The width is 2 only when every id is below 65 536.
            out.extend_from_slice(&(id as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    out
}

pub(super) fn bytes_to_ids(bytes: &[u8], width: usize) -> Vec<u32> {
    if width == 2 {
        bytes
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// The cached token streams of both splits, read and checked; `Err` says why they cannot be
/// used (missing, another tokenizer, a file damaged) so that they are encoded again.
pub(super) fn read_token_cache(
    corpus: &str,
    folder: &Path,
    tokenizer: &TextTokenizer,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let manifest_path = folder.join(TOKEN_MANIFEST);
    let manifest = fs::read_to_string(&manifest_path)
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let mut fields = BTreeMap::new();
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        if let Some((key, value)) = line.split_once(' ') {
            fields.insert(key, value);
        }
    }
    let field = |key: &str| {
        fields
            .get(key)
            .copied()
            .ok_or_else(|| format!("{} has no `{key}` line", manifest_path.display()))
    };
    let width = token_width(tokenizer.vocab_size());
    let expect = |key: &str, want: &str| -> Result<(), String> {
        let got = field(key)?;
        if got != want {
            return Err(format!(
                "{}: {key} is {got}, expected {want}",
                manifest_path.display()
            ));
        }
        Ok(())
    };
    expect("corpus", corpus)?;
    expect("tokenizer_sha256", tokenizer.sha256())?;
    expect("width", &width.to_string())?;
    let read = |split: &str| -> Result<Vec<u32>, String> {
        let name = token_file_name(split, width);
        let path = folder.join(&name);
        let count: u64 = field(&format!("{name}.tokens"))?
            .parse()
            .map_err(|_| format!("{}: bad token count of {name}", manifest_path.display()))?;
        let sha = field(&format!("{name}.sha256"))?;
        let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if bytes.len() as u64 != count * width as u64 {
            return Err(format!(
                "{} has {} bytes, expected {} ({count} tokens of {width} bytes; truncated or \
                 corrupt)",
                path.display(),
                bytes.len(),
                count * width as u64
            ));
        }
        let actual = crate::files::sha256_hex(&bytes);
        if actual != sha {
            return Err(format!(
                "{} is damaged: its sha256 is {actual}, expected {sha}",
                path.display()
            ));
        }
        let ids = bytes_to_ids(&bytes, width);
        if let Some(bad) = ids
            .iter()
            .find(|&&id| id as usize >= tokenizer.vocab_size())
        {
            return Err(format!(
                "{} holds token id {bad}, outside the tokenizer's {} ids",
                path.display(),
                tokenizer.vocab_size()
            ));
        }
        Ok(ids)
    };
    Ok((read(SPLITS[0])?, read(SPLITS[1])?))
}

/// The token streams of both splits: read from the token cache when it verifies, else encoded
/// (in parallel) and written to it atomically (a partial folder renamed into place). A folder
/// that is there but fails its checks is encoded again or refused, as `on_damage` says.
pub(super) fn cached_tokens(
    corpus: &str,
    dir: &Path,
    tokenizer: &TextTokenizer,
    train_docs: &[(&str, bool)],
    val_docs: &[(&str, bool)],
    on_damage: OnDamage,
) -> Result<(Vec<u32>, Vec<u32>), DataError> {
    let folder = token_cache_dir(dir, tokenizer.sha256());
    match read_token_cache(corpus, &folder, tokenizer) {
        Ok(streams) => return Ok(streams),
        Err(problem) if folder.exists() => match on_damage {
            OnDamage::Rebuild => {
                tracing::warn!(dataset = corpus, "{problem}; encoding the corpus again");
            }
            OnDamage::Refuse => {
                return Err(DataError::Invalid(format!(
                    "the token cache {} is damaged: {problem}; delete that folder to encode the \
                     text again",
                    folder.display()
                )))
            }
        },
        Err(_) => {}
    }
    let started = std::time::Instant::now();
    let train = tokenizer.encode_documents(train_docs)?;
    let val = tokenizer.encode_documents(val_docs)?;
    tracing::info!(
        dataset = corpus,
        train_tokens = train.len(),
        val_tokens = val.len(),
        seconds = started.elapsed().as_secs_f64(),
        "encoded the corpus"
    );
    write_token_cache(corpus, dir, &folder, tokenizer, &train, &val)?;
    Ok((train, val))
}

fn write_token_cache(
    corpus: &str,
    dir: &Path,
    folder: &Path,
    tokenizer: &TextTokenizer,
    train: &[u32],
    val: &[u32],
) -> Result<(), DataError> {
    let width = token_width(tokenizer.vocab_size());
    let key = folder
        .file_name()
        .map_or_else(|| "tokens".to_owned(), |n| n.to_string_lossy().into_owned());
    let staging = TempFolder::create(dir, &key)?;
    let mut manifest = format!(
        "# token ids of {corpus}, little-endian u{}, one file per split\ncorpus {corpus}\n\
         tokenizer_sha256 {}\ntokenizer_path {}\nwidth {width}\n",
        width * 8,
        tokenizer.sha256(),
        tokenizer.path().display()
    );
    for (split, ids) in SPLITS.into_iter().zip([train, val]) {
        let name = token_file_name(split, width);
        let bytes = ids_to_bytes(ids, width);
        write_synced(&staging.path.join(&name), &bytes)?;
        manifest.push_str(&format!(
            "{name}.tokens {}\n{name}.sha256 {}\n",
            ids.len(),
            crate::files::sha256_hex(&bytes)
        ));
    }
    write_synced(&staging.path.join(TOKEN_MANIFEST), manifest.as_bytes())?;
    if folder.exists() {
        fs::remove_dir_all(folder).map_err(|e| DataError::io(folder, e))?;
    }
    if let Err(e) = fs::rename(&staging.path, folder) {
        // Another process may have written the same streams meanwhile.
        if read_token_cache(corpus, folder, tokenizer).is_ok() {
            return Ok(());
        }
        return Err(DataError::io(folder, e));
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    // `staging` is dropped here; its folder was renamed away, so there is nothing to remove.
    Ok(())
}
