//! MDS datasets read from S3: shards written by `tessera data pack`, uploaded with boto3 to a
//! local S3 server (`moto`, started here on the loopback address), trained on with
//! `data_dir = "s3://bucket/prefix"`: the same losses and weights as from the local folder,
//! resumed mid-epoch exactly, through a cache smaller than the dataset, errors that name the
//! missing bucket or object, and a run over two (simulated) nodes whose nodes download the
//! training shards once between them.
//!
//! moto comes from `scripts/ensure-moto.sh` (`$TESSERA_MOTO_PYTHONPATH`, as `scripts/test.sh`
//! sets it). Without it the tests are skipped with a notice, unless `TESSERA_REQUIRE_MOTO=1`
//! (the test script) makes that a failure.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_tests::dist::{assert_all_succeeded, free_port, train_nodes, Ranks};
use tessera_tests::resume::{assert_same_checkpoint, names};
use tessera_tests::*;

const BUCKET: &str = "tessera-data";

/// How long the server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A moto S3 server on 127.0.0.1, killed when dropped.
struct Moto {
    child: Child,
    endpoint: String,
    pythonpath: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

impl Moto {
    /// Starts the server (its log in `dir/moto.log`); `None` with a notice when moto is not
    /// installed, a failure then under `TESSERA_REQUIRE_MOTO=1`.
    fn start(dir: &TempDir) -> Option<Moto> {
        let Some(pythonpath) = std::env::var("TESSERA_MOTO_PYTHONPATH")
            .ok()
            .filter(|v| !v.is_empty())
        else {
            let notice = "NOTICE: skipping: TESSERA_MOTO_PYTHONPATH is not set \
                          (scripts/ensure-moto.sh installs moto and prints the folder)";
            if std::env::var_os("TESSERA_REQUIRE_MOTO").is_some_and(|v| v == "1") {
                panic!("{notice} and TESSERA_REQUIRE_MOTO=1");
            }
            eprintln!("{notice}");
            return None;
        };
        let port = free_port();
        let log_path = dir.join("moto.log");
        let log = std::fs::File::create(&log_path).expect("create moto.log");
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .env("PYTHONPATH", &pythonpath)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} -m moto.server: {e}", python()));
        let mut moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            pythonpath,
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Some(moto);
            }
            let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("moto.server exited ({status}) before listening:\n{}", log());
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "moto.server did not listen on {addr} within {START_TIMEOUT:?}:\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The environment that points `tessera` (and boto3) at the server: dummy credentials, the
    /// endpoint, no proxy.
    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", &self.endpoint),
            ("AWS_ENDPOINT_URL_S3", &self.endpoint),
            ("NO_PROXY", "127.0.0.1,localhost"),
        ]
    }

    /// Runs boto3 code with `s3` a client of the server and `args` as `sys.argv[1:]`.
    fn boto3(&self, code: &str, args: &[&str]) {
        let script = format!(
            "import os, sys, boto3\n\
             s3 = boto3.client('s3', endpoint_url={:?}, aws_access_key_id='testing', \
             aws_secret_access_key='testing', region_name='us-east-1')\n{code}",
            self.endpoint
        );
        let mut cmd = Command::new(python());
        cmd.args(["-W", "ignore", "-c", &script])
            .args(args)
            .env("PYTHONPATH", &self.pythonpath)
            .env("NO_PROXY", "127.0.0.1,localhost");
        run_with_timeout(cmd, &format!("boto3 {args:?}"), PYTHON_TIMEOUT).assert_success();
    }

    /// Creates the bucket (once) and uploads every file under `root` to `prefix/<relative path>`.
    fn upload(&self, root: &Path, prefix: &str) {
        self.boto3(
            "bucket, root, prefix = sys.argv[1:4]\n\
             if bucket not in [b['Name'] for b in s3.list_buckets()['Buckets']]:\n\
             \x20   s3.create_bucket(Bucket=bucket)\n\
             for d, _, files in os.walk(root):\n\
             \x20   for f in files:\n\
             \x20       p = os.path.join(d, f)\n\
             \x20       s3.upload_file(p, bucket, prefix + '/' + os.path.relpath(p, root))\n",
            &[BUCKET, root.to_str().unwrap(), prefix],
        );
    }

    fn delete(&self, key: &str) {
        self.boto3(
            "s3.delete_object(Bucket=sys.argv[1], Key=sys.argv[2])",
            &[BUCKET, key],
        );
    }
}

/// A folder of noise PNG images (sizes 20..40, 3 classes, 10 per class and split), the same on
/// every run.
fn png_folder(dir: &TempDir) -> PathBuf {
    let root = dir.join("images");
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u32
    };
    for part in ["train", "val"] {
        for class in ["ant", "bee", "cat"] {
            let folder = root.join(part).join(class);
            std::fs::create_dir_all(&folder).unwrap();
            for k in 0..10 {
                let (w, h) = (20 + next() % 20, 20 + next() % 20);
                let image = image::RgbImage::from_fn(w, h, |_, _| {
                    let v = next();
                    image::Rgb([v as u8, (v >> 8) as u8, (v >> 16) as u8])
                });
                image.save(folder.join(format!("{k:03}.png"))).unwrap();
            }
        }
    }
    root
}

/// `tessera data pack` of the PNG folder as zstd MDS shards of at most 5 KB.
fn packed(dir: &TempDir) -> PathBuf {
    packed_in_shards_of(dir, "5KB")
}

/// `tessera data pack` of the PNG folder as zstd MDS shards of at most `shard_size`.
fn packed_in_shards_of(dir: &TempDir, shard_size: &str) -> PathBuf {
    let images = png_folder(dir);
    let root = dir.join("mds");
    pack(
        dir,
        &images,
        &root,
        &[
            "--format",
            "mds",
            "--compression",
            "zstd",
            "--shard-size",
            shard_size,
        ],
    );
    root
}

/// The shard files of split `part` of the packed dataset, as `index.json` lists them.
fn shard_names(root: &Path, part: &str) -> Vec<String> {
    let index = read_json(&root.join(part).join("index.json"));
    index["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["zip_data"]["basename"].as_str().unwrap().to_owned())
        .collect()
}

/// Bytes of the files directly in `folder`.
fn folder_bytes(folder: &Path) -> u64 {
    std::fs::read_dir(folder)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A trainer.toml for run `run_name` on `data_dir` (16×16 RGB, 3 classes, batches of 4, two
/// loader workers, shards shuffled in blocks of 2), checkpoints every 3 batches.
fn write_toml(dir: &TempDir, data_dir: &str, run_name: &str, shards_extra: &str) {
    let mut toml = TrainerToml::new(run_name);
    toml.data = format!(
        "dataset = \"mds\"\ndata_dir = {}\nbatch_size = 4\nworkers = 2\n\n\
         [data.shards]\nsize = 16\nclasses = 3\nshuffle_block = 2\n{shards_extra}",
        toml_string(data_dir)
    );
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"3ba\"\n", toml.render()),
    );
}

fn cache_key(dir: &Path) -> String {
    format!("cache_dir = {}\n", toml_string(&dir.display().to_string()))
}

fn train_losses(run: &Path) -> Vec<f64> {
    lines_of_kind(&read_jsonl(&run.join("metrics.jsonl")), "train")
        .iter()
        .map(|l| l["data"]["loss"].as_f64().expect("a loss"))
        .collect()
}

/// Both runs wrote the same checkpoints (by name), equal bit for bit.
fn assert_same_checkpoints(dir: &TempDir, a: &str, b: &str) {
    let (ca, cb) = (
        run_dir(dir, a).join("checkpoints"),
        run_dir(dir, b).join("checkpoints"),
    );
    let (na, nb) = (names(&ca), names(&cb));
    assert!(!na.is_empty(), "{a} wrote no checkpoint");
    assert_eq!(na, nb, "{a} and {b} wrote different checkpoints");
    for name in &na {
        assert_same_checkpoint(&ca.join(name), &cb.join(name));
    }
}

/// 30 training samples in batches of 4: 7 batches per epoch, so 9 batches reach into the second
/// epoch (its own shard order) and batch 5 is mid-epoch.
#[test]
fn training_from_s3_matches_the_local_folder_and_resumes_mid_epoch_exactly() {
    let dir = TempDir::new("s3-train");
    let Some(moto) = Moto::start(&dir) else {
        return;
    };
    let root = packed(&dir);
    let train_shards = shard_names(&root, "train");
    assert!(train_shards.len() >= 6, "{train_shards:?}: too few shards");
    moto.upload(&root, "packed/fm");
    let env = moto.env();
    let url = format!("s3://{BUCKET}/packed/fm");

    // (a) The same run on the local folder and on S3: the same losses and weights.
    write_toml(&dir, root.to_str().unwrap(), "local", "");
    train(&dir, &["train.max_duration=9ba"], &[]).assert_success();
    let local = train_losses(&run_dir(&dir, "local"));
    assert_eq!(local.len(), 9);
    let cache = dir.join("cache-remote");
    write_toml(&dir, &url, "remote", &cache_key(&cache));
    let out = train(&dir, &["train.max_duration=9ba"], &env);
    out.assert_success();
    let record = read_json(&run_dir(&dir, "remote").join("run.json"));
    assert_eq!(record["status"], "completed", "{record:#}");
    assert_eq!(record["config"]["data"]["data_dir"], url.as_str());
    assert_eq!(train_losses(&run_dir(&dir, "remote")), local);
    assert_same_checkpoints(&dir, "local", "remote");
    // Every shard of both splits went through the cache, which holds them all (10GB limit).
    let cached = std::fs::read_dir(&cache)
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_file()))
        .count();
    let val_shards = shard_names(&root, "val");
    assert_eq!(
        cached,
        train_shards.len() + val_shards.len(),
        "{}",
        out.dump()
    );
    assert_eq!(
        std::fs::read(cache.join(format!("train%2F{}", train_shards[0]))).unwrap(),
        std::fs::read(root.join("train").join(&train_shards[0])).unwrap()
    );

    // (b) Stopped at batch 5 (checkpoint at 3) and resumed with an empty cache: the resumed
    // block's shards are fetched again, and the run continues exactly.
    let cache = dir.join("cache-resumed");
    write_toml(&dir, &url, "resumed", &cache_key(&cache));
    train(&dir, &["train.max_duration=5ba"], &env).assert_success();
    std::fs::remove_dir_all(&cache).unwrap();
    let out = train(
        &dir,
        &["train.max_duration=9ba", "checkpoint.autoresume=true"],
        &env,
    );
    out.assert_success();
    assert!(out.stderr.contains("resumed from"), "{}", out.dump());
    assert_eq!(train_losses(&run_dir(&dir, "resumed")), local);
    let last = |run: &str| {
        let folder = run_dir(&dir, run).join("checkpoints");
        let name = names(&folder)
            .into_iter()
            .find(|n| n.ends_with("-ba9.ckpt"))
            .unwrap_or_else(|| panic!("{run} wrote no checkpoint at batch 9"));
        folder.join(name)
    };
    assert_same_checkpoint(&last("local"), &last("resumed"));

    // (d) A cache smaller than the dataset: shards are evicted (and fetched again when the next
    // epoch needs them), and the run is the same.
    let all: u64 = folder_bytes(&root.join("train")) + folder_bytes(&root.join("val"));
    let limit = all / 3;
    let cache = dir.join("cache-small");
    write_toml(
        &dir,
        &url,
        "small-cache",
        &format!(
            "{}cache_limit = \"{limit}B\"\nprefetch_shards = 1\n",
            cache_key(&cache)
        ),
    );
    let mut small_env = env.clone();
    small_env.push(("TESSERA_LOG", "info,tessera::data::shards::cache=debug"));
    let out = train(&dir, &["train.max_duration=9ba"], &small_env);
    out.assert_success();
    assert!(out.stderr.contains("evicted train/"), "{}", out.dump());
    let held = folder_bytes(&cache);
    assert!(
        held < all,
        "the cache holds {held} bytes, the whole dataset ({all})"
    );
    assert_eq!(train_losses(&run_dir(&dir, "small-cache")), local);
    assert_same_checkpoints(&dir, "local", "small-cache");
}

#[test]
fn a_missing_bucket_or_object_is_named() {
    let dir = TempDir::new("s3-errors");
    let Some(moto) = Moto::start(&dir) else {
        return;
    };
    let env = moto.env();
    // No such bucket: the first object asked for is named.
    write_toml(
        &dir,
        "s3://no-such-bucket/data",
        "no-bucket",
        &cache_key(&dir.join("cache-a")),
    );
    let out = train(&dir, &[], &env);
    assert!(!out.status.success(), "{}", out.dump());
    assert!(
        out.stderr
            .contains("s3://no-such-bucket/data/train/index.json: no such bucket `no-such-bucket`"),
        "{}",
        out.dump()
    );
    // A shard deleted after the upload, the cache empty: the run fails naming the object.
    let root = packed(&dir);
    moto.upload(&root, "broken");
    let shard = shard_names(&root, "train")[1].clone();
    moto.delete(&format!("broken/train/{shard}"));
    write_toml(
        &dir,
        &format!("s3://{BUCKET}/broken"),
        "no-object",
        &cache_key(&dir.join("cache-b")),
    );
    let out = train(&dir, &["train.max_duration=7ba"], &env);
    assert!(!out.status.success(), "{}", out.dump());
    let object = format!("s3://{BUCKET}/broken/train/{shard}: no such object");
    assert!(out.stderr.contains(&object), "{object}:\n{}", out.dump());
    // A missing index names it too.
    moto.delete("broken/val/index.json");
    write_toml(
        &dir,
        &format!("s3://{BUCKET}/broken"),
        "no-index",
        &cache_key(&dir.join("cache-c")),
    );
    let out = train(&dir, &[], &env);
    assert!(!out.status.success(), "{}", out.dump());
    let object = format!("s3://{BUCKET}/broken/val/index.json: no such object");
    assert!(out.stderr.contains(&object), "{object}:\n{}", out.dump());
}

/// The GET requests for training shards in moto's log (werkzeug logs one line per request).
fn shard_gets(dir: &TempDir) -> usize {
    std::fs::read_to_string(dir.join("moto.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"GET ") && l.contains("/train/shard."))
        .count()
}

/// The training shards in each node's cache folder (`cache-<tag>-<node>`).
fn cached_train_shards(dir: &TempDir, tag: &str) -> [Vec<String>; 2] {
    [0, 1].map(|node| {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(&format!("cache-{tag}-{node}")))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter_map(|n| n.strip_prefix("train%2F").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    })
}

/// One epoch on 4 ranks, ranks 0 and 1 sharing node 0's cache folder, 2 and 3 node 1's, each
/// rank told `LOCAL_WORLD_SIZE=local_world`: 2 makes them two nodes of two ranks, 4 one node.
fn train_on_two_caches(dir: &TempDir, moto: &Moto, tag: &str, local_world: usize) -> Vec<Output> {
    let run_name = format!("run_name={tag}");
    let overrides = ["train.max_duration=1ep", run_name.as_str()];
    let per_rank = |rank: usize| {
        let cache = dir.join(&format!("cache-{tag}-{}", rank / 2));
        vec![format!("data.shards.cache_dir={}", cache.display())]
    };
    train_nodes(
        dir,
        &Ranks {
            world: 4,
            local_world,
            overrides: &overrides,
            env: &moto.env(),
            per_rank: &per_rank,
        },
    )
}

/// Four ranks on two simulated nodes (`LOCAL_WORLD_SIZE=2`), each node with a cache folder of
/// its own: the nodes download each training shard once between them in an epoch, where one
/// node of four ranks (the order split round-robin over all ranks, as before node splits) has
/// both cache folders fetch nearly every shard.
#[test]
fn two_nodes_download_each_training_shard_once_between_them() {
    let dir = TempDir::new("s3-nodes");
    let Some(moto) = Moto::start(&dir) else {
        return;
    };
    // About 5 samples a shard, so that round-robin ranks share shards.
    let root = packed_in_shards_of(&dir, "16KB");
    let shards = shard_names(&root, "train");
    moto.upload(&root, "packed/nodes");
    let url = format!("s3://{BUCKET}/packed/nodes");
    // No shard of the next epoch is fetched ahead, so the caches hold what the epoch read.
    write_toml(&dir, &url, "nodes", "prefetch_shards = 0\n");

    let before = shard_gets(&dir);
    let outputs = train_on_two_caches(&dir, &moto, "one-node", 4);
    assert_all_succeeded(&outputs);
    let one_node_gets = shard_gets(&dir) - before;
    let [a, b] = cached_train_shards(&dir, "one-node");
    eprintln!(
        "one node of 4 ranks, two cache folders: {} + {} of {} shards cached, {one_node_gets} \
         shard downloads",
        a.len(),
        b.len(),
        shards.len()
    );
    assert!(
        a.len() + b.len() > shards.len() + shards.len() / 2,
        "{a:?} / {b:?}"
    );

    let before = shard_gets(&dir);
    let outputs = train_on_two_caches(&dir, &moto, "two-nodes", 2);
    assert_all_succeeded(&outputs);
    let two_node_gets = shard_gets(&dir) - before;
    let [a, b] = cached_train_shards(&dir, "two-nodes");
    eprintln!(
        "two nodes of 2 ranks: {} + {} of {} shards cached, {two_node_gets} shard downloads",
        a.len(),
        b.len(),
        shards.len()
    );
    assert!(a.iter().all(|s| !b.contains(s)), "{a:?} / {b:?}");
    let mut both: Vec<String> = a.iter().chain(&b).cloned().collect();
    both.sort();
    let mut all = shards.clone();
    all.sort();
    assert_eq!(both, all);
    assert_eq!(two_node_gets, shards.len(), "{}", outputs[0].dump());
    let record = read_json(&run_dir(&dir, "two-nodes").join("run.json"));
    assert_eq!(record["status"], "completed", "{record:#}");
    assert_eq!(record["nodes"], 2, "{record:#}");
}

/// A run whose sharded data is split over two simulated nodes (a local MDS folder: no S3
/// needed) resumes from its mid-epoch checkpoint on two nodes exactly where the straight run
/// went, and is refused on one node of the same four ranks, whose order inside the epoch
/// differs, with a message naming both splits; the epoch-end checkpoint resumes anywhere.
#[test]
fn a_mid_epoch_checkpoint_split_over_two_nodes_resumes_on_two_nodes_only() {
    let dir = TempDir::new("nodes-resume");
    let root = packed_in_shards_of(&dir, "16KB");
    write_toml(&dir, &root.display().to_string(), "nodes", "");
    // Global batch 4 (one sample a rank): several batches an epoch, checkpoints every 3.
    let on = |local_world: usize, overrides: &[&str]| {
        let mut all = vec!["data.batch_size=1"];
        all.extend_from_slice(overrides);
        train_nodes(
            &dir,
            &Ranks {
                world: 4,
                local_world,
                overrides: &all,
                env: &[],
                per_rank: &|_| Vec::new(),
            },
        )
    };
    assert_all_succeeded(&on(2, &["run_name=straight", "train.max_duration=6ba"]));
    let straight = run_dir(&dir, "straight").join("checkpoints");
    let meta = tessera::checkpoint::Checkpoint::read(&straight.join("ep0-ba3.ckpt"))
        .expect("the checkpoint reads")
        .meta;
    assert_eq!(meta.trainer.data_nodes, Some(2));
    assert_ne!(meta.timestamp.batch_in_epoch, 0, "not mid-epoch: {meta:?}");
    let load = format!(
        "checkpoint.load={}",
        toml_string(&straight.join("ep0-ba3.ckpt").display().to_string())
    );

    let refused = on(4, &["run_name=one-node", "train.max_duration=6ba", &load]);
    assert!(refused.iter().all(|o| !o.status.success()));
    let message = &refused[0].stderr;
    for part in [
        "in the middle of epoch 0",
        "split over 2 nodes",
        "in one order for all ranks",
        "Resume on 2 node(s)",
    ] {
        assert!(message.contains(part), "{part:?}: {}", refused[0].dump());
    }

    assert_all_succeeded(&on(
        2,
        &["run_name=two-nodes", "train.max_duration=6ba", &load],
    ));
    assert_same_checkpoint(
        &straight.join("ep0-ba6.ckpt"),
        &run_dir(&dir, "two-nodes")
            .join("checkpoints")
            .join("ep0-ba6.ckpt"),
    );
}
