//! Unit tests of sharded datasets through the loader: written with Tessera's own writers (the
//! packages' shards are read in tests/data/streaming.rs).
use std::sync::Arc;

use super::*;
use crate::data::{HostBatch, Loader, LoaderOptions};

/// A temporary folder removed when dropped.
struct Temp(PathBuf);

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp(label: &str) -> Temp {
    let dir = std::env::temp_dir().join(format!("tessera-shards-{}-{label}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("train")).unwrap();
    Temp(dir)
}

/// 64 samples of 2×2 grey pixels `[i, i, 255 - i, 7]`, label `i % 4`, in shards of about 6.
fn write(format: ShardFormat, dir: &Path, compression: Option<&str>) {
    write_sized(format, dir, compression, 400);
}

/// As [`write`], MDS shards of at most `shard_size` bytes.
fn write_sized(format: ShardFormat, dir: &Path, compression: Option<&str>, shard_size: usize) {
    let train = dir.join("train");
    match format {
        ShardFormat::Mds => {
            let columns = vec![
                (
                    "x".to_string(),
                    mds::Encoding::NdArray {
                        dtype: Some(mds::Dtype::U8),
                        shape: Some(vec![2, 2]),
                    },
                ),
                ("y".to_string(), mds::Encoding::Int),
            ];
            let mut w =
                mds::Writer::new(&train, columns, compression.map(str::to_string), shard_size)
                    .unwrap();
            for i in 0..64u8 {
                w.write(&[
                    vec![i, i, 255 - i, 7],
                    i64::from(i % 4).to_le_bytes().to_vec(),
                ])
                .unwrap();
            }
            assert!(w.finish().unwrap() > 4);
        }
        ShardFormat::Wds => {
            let mut w = wds::Writer::new(&train, "shard", 6 * 3 * 1024);
            for i in 0..64u8 {
                let mut png = Vec::new();
                image::ImageEncoder::write_image(
                    image::codecs::png::PngEncoder::new(&mut png),
                    &[i, i, 255 - i, 7],
                    2,
                    2,
                    image::ExtendedColorType::L8,
                )
                .unwrap();
                let cls = (i % 4).to_string();
                w.write(
                    &format!("s{i:03}"),
                    &[("png", &png), ("cls", cls.as_bytes())],
                )
                .unwrap();
            }
            assert!(w.finish().unwrap() > 4);
        }
    }
}

/// The bytes of an encoded sample.
fn encoded(data: crate::data::SampleData<'_>) -> Vec<u8> {
    match data {
        crate::data::SampleData::Encoded { bytes, .. } => bytes.into_owned(),
        crate::data::SampleData::Pixels(_) => panic!("sharded sources serve encoded images"),
    }
}

fn open(format: ShardFormat, dir: &Path) -> Arc<Sharded> {
    let mut config = ShardsConfig {
        shuffle_block: 2,
        ..ShardsConfig::new(format, 2, 4)
    };
    config.images.channels = 1;
    Arc::new(Sharded::open(dir, "train", format, &config).unwrap())
}

fn loader(source: &Arc<Sharded>, batch: usize, workers: usize) -> Loader {
    let options = LoaderOptions {
        batch_size: batch,
        shuffle: true,
        drop_last: false,
        seed: 3,
        workers,
        prefetch: 2,
    };
    Loader::new(source.clone(), Arc::new(Vec::new()), options).unwrap()
}

/// The sample ids (first pixel) of each batch.
fn ids(batches: &[HostBatch]) -> Vec<Vec<u8>> {
    batches
        .iter()
        .map(|b| {
            let Some(crate::data::Pixels::Bytes(pixels)) = b.pixels() else {
                panic!("u8 pixels expected");
            };
            (0..b.len()).map(|i| pixels[i * 4]).collect()
        })
        .collect()
}

fn epoch(l: &Loader, e: u64, start: u64) -> Vec<HostBatch> {
    l.epoch(e, start).collect::<Result<Vec<_>, _>>().unwrap()
}

#[test]
fn sharded_order_is_world_size_independent_and_resumes_in_place() {
    for (format, compression) in [
        (ShardFormat::Mds, None),
        (ShardFormat::Mds, Some("zstd:3")),
        (ShardFormat::Wds, None),
    ] {
        let dir = temp(&format!("{format:?}-{}", compression.is_some()));
        write(format, &dir.0, compression);
        let source = open(format, &dir.0);
        assert_eq!(source.len(), 64);
        let what = format!("{format:?} {compression:?}");
        // Pixels and labels as written.
        for i in [0usize, 17, 63] {
            let (data, label) = source.read(i).unwrap().unwrap();
            let pixels = crate::data::decode::decode_image(
                &encoded(data),
                "sample",
                &source.plan,
                &mut rand::thread_rng(),
            )
            .unwrap();
            assert_eq!(&pixels[..], &[i as u8, i as u8, 255 - i as u8, 7], "{what}");
            assert_eq!(label, i as i64 % 4, "{what}");
        }
        // One process of batch 16: every sample once, in the source's shard-block order.
        let whole = ids(&epoch(&loader(&source, 16, 0), 1, 0));
        let flat: Vec<u32> = whole.iter().flatten().map(|&i| u32::from(i)).collect();
        assert_eq!(flat, source.epoch_order(3, 1).unwrap(), "{what}");
        let mut sorted = flat.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<u32>>(), "{what}");
        // W ranks of batch 16 / W (any worker count): batch b of the ranks together is batch b
        // of the one process.
        for world in [2usize, 4] {
            let ranks: Vec<Vec<Vec<u8>>> = (0..world)
                .map(|r| {
                    ids(&epoch(
                        &loader(&source, 16 / world, r % 3).shard(r, world, true),
                        1,
                        0,
                    ))
                })
                .collect();
            for (b, global) in whole.iter().enumerate() {
                let mut got: Vec<u8> = ranks.iter().flat_map(|r| r[b].clone()).collect();
                let mut want = global.clone();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "{what}: {world} ranks, batch {b}");
            }
        }
        // Resuming at batch 2 yields batches 2.. of the uninterrupted epoch.
        assert_eq!(
            ids(&epoch(&loader(&source, 16, 2), 1, 2)),
            whole[2..],
            "{what}"
        );
        // Another epoch, another order.
        assert_ne!(ids(&epoch(&loader(&source, 16, 0), 2, 0)), whole, "{what}");
    }
}

/// The shard (index, from its first sample) holding sample `id` of [`write`]'s dataset.
fn shard_of(source: &Sharded, id: u8) -> usize {
    source.locate(usize::from(id)).unwrap().0
}

#[test]
fn over_two_nodes_each_node_reads_its_own_shards_and_every_sample_once() {
    let dir = temp("nodes");
    write(ShardFormat::Mds, &dir.0, None);
    let source = open(ShardFormat::Mds, &dir.0);
    let shards = source.shard_sizes().len();
    // 4 ranks, 2 per node (ranks 0, 1 on node 0; 2, 3 on node 1), batches of 4.
    let rank = |r: usize, workers: usize| {
        loader(&source, 4, workers)
            .shard(r, 4, true)
            .across_nodes(2)
    };
    let span = order::NodeSplit { nodes: 2 }.span(source.shard_sizes());
    for e in [0u64, 1] {
        let ranks: Vec<Vec<Vec<u8>>> = (0..4).map(|r| ids(&epoch(&rank(r, r % 3), e, 0))).collect();
        // Every rank has as many batches; each node's ranks read shards no other node reads.
        let per_rank = span.div_ceil(2);
        for (r, batches) in ranks.iter().enumerate() {
            assert_eq!(batches.len(), per_rank.div_ceil(4), "rank {r}");
            assert_eq!(rank(r, 0).len(), per_rank, "rank {r}");
        }
        let node_shards = |node: usize| {
            let mut s: Vec<usize> = ranks[2 * node..2 * node + 2]
                .iter()
                .flatten()
                .flatten()
                .map(|&id| shard_of(&source, id))
                .collect();
            s.sort_unstable();
            s.dedup();
            s
        };
        let (a, b) = (node_shards(0), node_shards(1));
        assert!(a.iter().all(|s| !b.contains(s)), "epoch {e}: {a:?} / {b:?}");
        assert_eq!(a.len() + b.len(), shards, "epoch {e}");
        // Every sample is trained on, each at least once; repeats only pad a node's share.
        let mut all: Vec<u8> = ranks.iter().flatten().flatten().copied().collect();
        assert_eq!(all.len(), 4 * per_rank);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, (0..64).collect::<Vec<u8>>(), "epoch {e}");
        // Resuming at batch 2 yields batches 2.. of the uninterrupted epoch, any worker count.
        for (r, batches) in ranks.iter().enumerate() {
            assert_eq!(ids(&epoch(&rank(r, 2), e, 2)), batches[2..], "rank {r}");
        }
    }
    // One node of 4 ranks, or ranks that do not fill their nodes: the order of today.
    for (world, per_node) in [(4, 4), (3, 2)] {
        for r in 0..world {
            let plain = loader(&source, 4, 0).shard(r, world, true);
            assert_eq!(
                ids(&epoch(&plain.clone().across_nodes(per_node), 1, 0)),
                ids(&epoch(&plain, 1, 0))
            );
        }
    }
}

#[test]
fn over_two_nodes_each_node_caches_only_its_own_shards() {
    let dir = temp("node-caches");
    write(ShardFormat::Mds, &dir.0, Some("zstd:3"));
    let mut config = ShardsConfig {
        shuffle_block: 2,
        prefetch_shards: Some(0),
        ..ShardsConfig::new(ShardFormat::Mds, 2, 4)
    };
    config.images.channels = 1;
    let remote: Arc<dyn cache::Remote> = Arc::new(cache::FolderRemote::new(&dir.0));
    let mut cached = Vec::new();
    for node in 0..2 {
        let cache = cache::ShardCache::new(
            Arc::clone(&remote),
            &dir.0.join(format!("cache-{node}")),
            1 << 30,
        )
        .unwrap();
        for local in 0..2 {
            // Each rank opens the dataset itself, as a rank process does.
            let source =
                Arc::new(Sharded::open_remote(&cache, "train", ShardFormat::Mds, &config).unwrap());
            let l = loader(&source, 4, 1)
                .shard(2 * node + local, 4, true)
                .across_nodes(2);
            epoch(&l, 0, 0);
        }
        cached.push(cache.cached());
    }
    let shards = open(ShardFormat::Mds, &dir.0).shard_sizes().len();
    assert!(
        cached[0].iter().all(|k| !cached[1].contains(k)),
        "{cached:?}"
    );
    assert_eq!(cached[0].len() + cached[1].len(), shards, "{cached:?}");
}

#[test]
fn a_truncated_shard_is_refused_naming_it() {
    let dir = temp("truncated");
    write(ShardFormat::Mds, &dir.0, None);
    let shard = dir.0.join("train").join("shard.00001.mds");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 3]).unwrap();
    let err = Sharded::open(
        &dir.0,
        "train",
        ShardFormat::Mds,
        &ShardsConfig::new(ShardFormat::Mds, 2, 4),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("shard.00001.mds") && err.contains("index.json says"),
        "{err}"
    );
}

#[test]
fn a_wrong_column_an_unusable_encoding_or_a_pattern_without_files_is_named() {
    let dir = temp("errors");
    write(ShardFormat::Mds, &dir.0, None);
    let open = |format, split: &str, config: &ShardsConfig| {
        Sharded::open(&dir.0, split, format, config)
            .unwrap_err()
            .to_string()
    };
    // A column name the index does not have: the columns it has are listed.
    let mut config = ShardsConfig::new(ShardFormat::Mds, 2, 4);
    config.image = "img".into();
    let err = open(ShardFormat::Mds, "train", &config);
    assert!(err.contains("index.json"), "{err}");
    assert!(
        err.contains("no column `img` ([data.shards] image); its columns: x, y"),
        "{err}"
    );
    // Image and label swapped: the encoding that cannot hold them is named.
    config.image = "y".into();
    let err = open(ShardFormat::Mds, "train", &config);
    assert!(
        err.contains("column `y` ([data.shards] image) has encoding `int`"),
        "{err}"
    );
    config.image = "x".into();
    config.label = "x".into();
    let err = open(ShardFormat::Mds, "train", &config);
    assert!(
        err.contains("column `x` ([data.shards] label) has encoding `ndarray:uint8:2,2`")
            || err.contains("column `x` ([data.shards] label) has encoding `ndarray"),
        "{err}"
    );
    // An encoding Tessera does not know (a pickled column) is named in the index.
    let index = dir.0.join("train").join(mds::INDEX);
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, text.replace("\"int\"", "\"pkl\"")).unwrap();
    let err = open(
        ShardFormat::Mds,
        "train",
        &ShardsConfig::new(ShardFormat::Mds, 2, 4),
    );
    assert!(
        err.contains("column `y` ([data.shards] label) has encoding `pkl`"),
        "{err}"
    );

    // A brace pattern naming shards that do not exist.
    let wds_dir = temp("errors-wds");
    write(ShardFormat::Wds, &wds_dir.0, None);
    let err = Sharded::open(
        &wds_dir.0,
        "train/shard-{000000..000099}.tar",
        ShardFormat::Wds,
        &ShardsConfig::new(ShardFormat::Wds, 2, 4),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("shard-{000000..000099}.tar"), "{err}");
    assert!(err.contains("names 100 file(s)"), "{err}");
    assert!(err.contains("missing (the first: "), "{err}");
}

#[test]
fn a_remote_dataset_read_through_a_small_cache_matches_the_folder_bit_for_bit() {
    for compression in [None, Some("zstd:3")] {
        let dir = temp(&format!("remote-{}", compression.is_some()));
        write_sized(ShardFormat::Mds, &dir.0, compression, 100);
        let local = open(ShardFormat::Mds, &dir.0);
        let shard_bytes: Vec<u64> = mds::Index::read(&dir.0.join("train"))
            .unwrap()
            .shards
            .iter()
            .map(|s| s.stored().bytes)
            .collect();
        let largest = shard_bytes.iter().copied().max().unwrap();
        let total: u64 = shard_bytes.iter().sum();
        // Room for 7 shards of the 16 or so (blocks of 2, the previous, current and next block
        // pinned): reading an epoch must evict.
        let limit = 7 * largest;
        assert!(limit < total, "{limit} vs {total}");
        let remote = Arc::new(cache::FolderRemote::new(&dir.0));
        let store = cache::ShardCache::new(remote, &dir.0.join("cache"), limit).unwrap();
        let mut config = ShardsConfig {
            shuffle_block: 2,
            prefetch_shards: Some(1),
            ..ShardsConfig::new(ShardFormat::Mds, 2, 4)
        };
        config.images.channels = 1;
        let remote =
            Arc::new(Sharded::open_remote(&store, "train", ShardFormat::Mds, &config).unwrap());
        assert_eq!(remote.len(), local.len());
        for e in [1, 2] {
            let whole = ids(&epoch(&loader(&local, 16, 0), e, 0));
            assert_eq!(ids(&epoch(&loader(&remote, 16, 2), e, 0)), whole);
            assert!(store.used() <= limit, "{} > {limit}", store.used());
            // Resuming mid-epoch, with evicted shards to fetch again.
            assert_eq!(ids(&epoch(&loader(&remote, 16, 1), e, 2)), whole[2..]);
        }
        assert!(
            store.fetches() > shard_bytes.len() as u64,
            "{} fetches of {} shards: nothing was evicted",
            store.fetches(),
            shard_bytes.len()
        );
        // WebDataset shards are read from folders only.
        let err = Sharded::open_remote(&store, "train", ShardFormat::Wds, &config)
            .unwrap_err()
            .to_string();
        assert!(err.contains("local folders only"), "{err}");
        // A missing split names its index.
        let err = Sharded::open_remote(&store, "nope", ShardFormat::Mds, &config)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope/index.json"), "{err}");
    }
}
