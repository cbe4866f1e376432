//! Writing MDS shards (`Writer`): samples into shard files of a size limit, and their
//! index.json.

use std::path::{Path, PathBuf};

use super::Encoding;
use super::{Column, INDEX};
use crate::data::DataError;

/// An MDS shard writer: samples accumulate until the shard reaches `size_limit` bytes, then
/// the shard is written (atomically) and listed; [`Writer::finish`] writes `index.json` last.
#[derive(Debug)]
pub struct Writer {
    dir: PathBuf,
    columns: Vec<Column>,
    compression: Option<String>,
    size_limit: usize,
    samples: Vec<Vec<u8>>,
    pending: usize,
    config: Vec<u8>,
    shards: Vec<serde_json::Value>,
}

impl Writer {
    /// A writer into the (existing) folder `dir`; columns are sorted by name as streaming's
    /// writer sorts them. `compression` is `None` or `zstd:LEVEL`.
    pub fn new(
        dir: &Path,
        mut columns: Vec<(String, Encoding)>,
        compression: Option<String>,
        size_limit: usize,
    ) -> Result<Writer, DataError> {
        columns.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(c) = &compression {
            let level = c.strip_prefix("zstd:").and_then(|l| l.parse::<i32>().ok());
            if !(c == "zstd" || level.is_some_and(|l| (1..=22).contains(&l))) {
                return Err(DataError::Invalid(format!(
                    "compression `{c}`: Tessera writes `zstd` or `zstd:LEVEL` (1-22)"
                )));
            }
        }
        let columns: Vec<Column> = columns
            .into_iter()
            .map(|(name, encoding)| Column {
                size: encoding.fixed_size(),
                name,
                encoding,
            })
            .collect();
        let config = serde_json::json!({
            "version": 2,
            "format": "mds",
            "compression": compression,
            "hashes": ["sha256"],
            "size_limit": size_limit,
            "column_names": columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            "column_encodings": columns.iter().map(|c| c.encoding.name()).collect::<Vec<_>>(),
            "column_sizes": columns.iter().map(|c| c.size).collect::<Vec<_>>(),
        });
        Ok(Writer {
            dir: dir.to_path_buf(),
            columns,
            compression,
            size_limit,
            samples: Vec::new(),
            pending: 0,
            config: serde_json::to_vec(&config).unwrap_or_default(),
            shards: Vec::new(),
        })
    }

    /// Adds a sample: one encoded value per column, in the order of the names given to
    /// [`Writer::new`] sorted.
    pub fn write(&mut self, values: &[Vec<u8>]) -> Result<(), DataError> {
        if values.len() != self.columns.len() {
            return Err(DataError::Invalid(format!(
                "{} values for {} columns",
                values.len(),
                self.columns.len()
            )));
        }
        let mut sample = Vec::new();
        for (c, v) in self.columns.iter().zip(values) {
            match c.size {
                Some(s) if s != v.len() => {
                    return Err(DataError::Invalid(format!(
                        "column `{}` ({}) takes {s} bytes, got {}",
                        c.name,
                        c.encoding.name(),
                        v.len()
                    )))
                }
                Some(_) => {}
                None => {
                    let n = u32::try_from(v.len()).map_err(|_| {
                        DataError::Invalid(format!("a `{}` value over 4 GiB", c.name))
                    })?;
                    sample.extend_from_slice(&n.to_le_bytes());
                }
            }
        }
        for v in values {
            sample.extend_from_slice(v);
        }
        let extra = 4 + 4 + self.config.len();
        if !self.samples.is_empty() && self.pending + sample.len() + 4 + extra > self.size_limit {
            self.flush()?;
        }
        self.pending += sample.len() + 4;
        self.samples.push(sample);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DataError> {
        if self.samples.is_empty() {
            return Ok(());
        }
        let n = self.samples.len();
        let header = 4 * (n + 2) + self.config.len();
        let mut raw = Vec::with_capacity(header + self.pending);
        raw.extend_from_slice(&(n as u32).to_le_bytes());
        let mut offset = header;
        raw.extend_from_slice(&(offset as u32).to_le_bytes());
        for s in &self.samples {
            offset += s.len();
            let o = u32::try_from(offset).map_err(|_| {
                DataError::Invalid("a shard over 4 GiB; lower the shard size".into())
            })?;
            raw.extend_from_slice(&o.to_le_bytes());
        }
        raw.extend_from_slice(&self.config);
        for s in &self.samples {
            raw.extend_from_slice(s);
        }
        let raw_name = format!("shard.{:05}.mds", self.shards.len());
        let raw_info = info(&raw_name, &raw);
        let (zip_info, stored_name, stored) = match &self.compression {
            Some(c) => {
                let level = c
                    .strip_prefix("zstd:")
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(3);
                // One-shot compression writes the content size in the frame header, which the
                // `zstd` Python package that streaming uses requires.
                let zip = zstd::bulk::compress(&raw, level)
                    .map_err(|e| DataError::Invalid(format!("zstd: {e}")))?;
                let name = format!("{raw_name}.zstd");
                (Some(info(&name, &zip)), name, zip)
            }
            None => (None, raw_name, raw),
        };
        crate::data::shards::write_atomic(&self.dir.join(&stored_name), &stored)?;
        let mut obj = serde_json::json!({
            "version": 2,
            "format": "mds",
            "compression": self.compression,
            "hashes": ["sha256"],
            "size_limit": self.size_limit,
            "column_names": self.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            "column_encodings": self.columns.iter().map(|c| c.encoding.name()).collect::<Vec<_>>(),
            "column_sizes": self.columns.iter().map(|c| c.size).collect::<Vec<_>>(),
            "samples": n,
            "raw_data": raw_info,
        });
        obj["zip_data"] = zip_info.unwrap_or(serde_json::Value::Null);
        self.shards.push(obj);
        self.samples.clear();
        self.pending = 0;
        Ok(())
    }

    /// Writes the last shard and `index.json`; returns the number of shards.
    pub fn finish(mut self) -> Result<usize, DataError> {
        self.flush()?;
        let index = serde_json::json!({ "version": 2, "shards": self.shards });
        let text = serde_json::to_vec(&index)
            .map_err(|e| DataError::Invalid(format!("index.json: {e}")))?;
        crate::data::shards::write_atomic(&self.dir.join(INDEX), &text)?;
        Ok(self.shards.len())
    }
}

fn info(name: &str, data: &[u8]) -> serde_json::Value {
    let hex = crate::files::sha256_hex(data);
    serde_json::json!({ "basename": name, "bytes": data.len(), "hashes": { "sha256": hex } })
}
