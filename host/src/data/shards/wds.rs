//! WebDataset shards: tar files whose members are grouped into samples by key, the member name
//! before the first dot of its last path component (`n01440764/img_7.jpg` and
//! `n01440764/img_7.cls` are the `jpg` and `cls` fields of sample `n01440764/img_7`). Members of
//! one sample are consecutive in the tar, as webdataset's writer leaves them.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::data::DataError;

/// Where one field of a sample lies in its tar file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Byte offset of the member's data in the tar file.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// One sample of a shard: its key and fields (extension → member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The key shared by the sample's members.
    pub key: String,
    /// `(extension, member)` in tar order; extensions as in the file names (`jpg`, `cls`,
    /// `seg.png`).
    pub fields: Vec<(String, Member)>,
}

impl Sample {
    /// The member of the first of `extensions` (compared without case) the sample has.
    pub fn field(&self, extensions: &[String]) -> Option<(&str, Member)> {
        extensions.iter().find_map(|e| {
            self.fields
                .iter()
                .find(|(x, _)| x.eq_ignore_ascii_case(e))
                .map(|(x, m)| (x.as_str(), *m))
        })
    }
}

/// Splits a member name into key and extension as webdataset does: the extension is everything
/// after the first dot of the last path component. `None` for names without one.
pub fn key_and_extension(name: &str) -> Option<(&str, &str)> {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[base..].find('.')? + base;
    if dot == base {
        return None;
    }
    Some((&name[..dot], &name[dot + 1..]))
}

/// Lists the samples of a tar shard (reading headers only; the data is skipped by seeking).
pub fn scan(path: &Path) -> Result<Vec<Sample>, DataError> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut archive = tar::Archive::new(file);
    let bad = |e: std::io::Error| DataError::format(path, format!("not a readable tar file: {e}"));
    let mut samples: Vec<Sample> = Vec::new();
    for entry in archive.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(bad)?.to_string_lossy().into_owned();
        // webdataset skips metadata members such as `__index__` and files without an extension.
        let Some((key, extension)) = key_and_extension(&name) else {
            continue;
        };
        if key.rsplit('/').next().is_some_and(|k| k.starts_with("__")) {
            continue;
        }
        let member = Member {
            offset: entry.raw_file_position(),
            size: entry.size(),
        };
        match samples.last_mut() {
            Some(last) if last.key == key => last.fields.push((extension.to_string(), member)),
            _ => samples.push(Sample {
                key: key.to_string(),
                fields: vec![(extension.to_string(), member)],
            }),
        }
    }
    Ok(samples)
}

/// Reads `member` of the open tar `file` (at `path`, for errors).
pub fn read_member(file: &File, member: Member, path: &Path) -> Result<Vec<u8>, DataError> {
    use std::os::unix::fs::FileExt as _;
    let size = usize::try_from(member.size)
        .map_err(|_| DataError::format(path, "a member too large for memory"))?;
    let mut buf = vec![0u8; size];
    file.read_exact_at(&mut buf, member.offset)
        .map_err(|e| DataError::io(path, e))?;
    Ok(buf)
}

/// Expands the shard list: a folder (its `*.tar` files, sorted), a brace pattern
/// (`train-{000000..000009}.tar`, with zero padding kept, or `{a,b}`), or one file.
pub fn shard_paths(spec: &Path) -> Result<Vec<PathBuf>, DataError> {
    if spec.is_dir() {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(spec)
            .map_err(|e| DataError::io(spec, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "tar") && p.is_file())
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(DataError::format(spec, "holds no .tar shards"));
        }
        return Ok(paths);
    }
    let text = spec.to_string_lossy();
    let names = expand_braces(&text).map_err(|e| DataError::format(spec, e))?;
    let paths: Vec<PathBuf> = names.into_iter().map(PathBuf::from).collect();
    let missing: Vec<&PathBuf> = paths.iter().filter(|p| !p.is_file()).collect();
    if let Some(first) = missing.first() {
        return Err(DataError::format(
            spec,
            format!(
                "is neither a folder nor a pattern of existing shards: it names {} file(s), \
                 {} of them missing (the first: {})",
                paths.len(),
                missing.len(),
                first.display()
            ),
        ));
    }
    Ok(paths)
}

/// Expands `{A..B}` ranges (zero-padded to the width of `A`) and `{x,y}` alternatives, as the
/// `braceexpand` package does for webdataset shard lists.
pub fn expand_braces(text: &str) -> Result<Vec<String>, String> {
    let Some(open) = text.find('{') else {
        return Ok(vec![text.to_string()]);
    };
    let close = text[open..]
        .find('}')
        .map(|i| i + open)
        .ok_or_else(|| format!("`{text}`: a `{{` without its `}}`"))?;
    let inner = &text[open + 1..close];
    let choices: Vec<String> = if let Some((a, b)) = inner.split_once("..") {
        let (start, end) = (
            a.parse::<u64>()
                .map_err(|_| format!("`{{{inner}}}`: `{a}` is not a number"))?,
            b.parse::<u64>()
                .map_err(|_| format!("`{{{inner}}}`: `{b}` is not a number"))?,
        );
        if end < start {
            return Err(format!("`{{{inner}}}` counts down"));
        }
        if end - start > 10_000_000 {
            return Err(format!("`{{{inner}}}` names more than 10 million shards"));
        }
        let width = if a.starts_with('0') { a.len() } else { 0 };
        (start..=end).map(|i| format!("{i:0width$}")).collect()
    } else {
        inner.split(',').map(str::to_string).collect()
    };
    let rest = expand_braces(&text[close + 1..])?;
    let mut out = Vec::with_capacity(choices.len() * rest.len());
    for c in &choices {
        for r in &rest {
            out.push(format!("{}{c}{r}", &text[..open]));
        }
    }
    Ok(out)
}

/// Writes WebDataset shards: `prefix-NNNNNN.tar` files of at most `size_limit` bytes (the last
/// one smaller), each written to a temporary and renamed when complete.
pub struct Writer {
    dir: PathBuf,
    prefix: String,
    size_limit: u64,
    builder: Option<tar::Builder<std::io::BufWriter<File>>>,
    partial: PathBuf,
    bytes: u64,
    shards: usize,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("wds::Writer")
            .field("dir", &self.dir)
            .field("shards", &self.shards)
            .finish()
    }
}

impl Writer {
    /// A writer into the (existing) folder `dir`.
    pub fn new(dir: &Path, prefix: &str, size_limit: u64) -> Writer {
        Writer {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            size_limit,
            builder: None,
            partial: PathBuf::new(),
            bytes: 0,
            shards: 0,
        }
    }

    fn name(&self) -> PathBuf {
        self.dir
            .join(format!("{}-{:06}.tar", self.prefix, self.shards))
    }

    /// Adds a sample: `key` with its `(extension, bytes)` fields.
    pub fn write(&mut self, key: &str, fields: &[(&str, &[u8])]) -> Result<(), DataError> {
        let size: u64 = fields.iter().map(|f| 512 + f.1.len() as u64 + 511).sum();
        if self.builder.is_some() && self.bytes + size > self.size_limit {
            self.close()?;
        }
        if self.builder.is_none() {
            let name = self.name();
            self.partial = super::partial_name(&name);
            let file = File::create(&self.partial).map_err(|e| DataError::io(&self.partial, e))?;
            self.builder = Some(tar::Builder::new(std::io::BufWriter::new(file)));
            self.bytes = 0;
        }
        let partial = self.partial.clone();
        let Some(builder) = self.builder.as_mut() else {
            return Ok(());
        };
        for (extension, data) in fields {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o444);
            header.set_mtime(0);
            header.set_entry_type(tar::EntryType::Regular);
            builder
                .append_data(&mut header, format!("{key}.{extension}"), *data)
                .map_err(|e| DataError::io(&partial, e))?;
        }
        self.bytes += size;
        Ok(())
    }

    fn close(&mut self) -> Result<(), DataError> {
        let Some(builder) = self.builder.take() else {
            return Ok(());
        };
        let partial = self.partial.clone();
        let out = builder
            .into_inner()
            .map_err(|e| DataError::io(&partial, e))?;
        let file = out
            .into_inner()
            .map_err(|e| DataError::io(&partial, e.into_error()))?;
        file.sync_all().map_err(|e| DataError::io(&partial, e))?;
        let name = self.name();
        std::fs::rename(&partial, &name).map_err(|e| DataError::io(&name, e))?;
        self.shards += 1;
        Ok(())
    }

    /// Closes the last shard; returns the number of shards written.
    pub fn finish(mut self) -> Result<usize, DataError> {
        self.close()?;
        Ok(self.shards)
    }
}
