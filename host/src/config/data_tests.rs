//! Tests of `[data]` for images: an image folder, MDS and WebDataset shards, the shard cache and remote data.

use super::*;
use crate::data::Dataset;

use super::tests::*;

#[test]
fn folder_dataset() {
    use crate::data::{FolderConfig, OnBadFile};
    let dir = crate::data::idx::tests::TempDir::new("config-folder");
    for class in ["b", "a", "c"] {
        std::fs::create_dir_all(dir.0.join("train").join(class)).unwrap();
    }
    let data_dir = format!("data_dir = {:?}\n", dir.0.display().to_string());
    let folder = |extra: &str| {
        MINIMAL.replace(
            "dataset = \"fashion-mnist\"\n",
            &format!("dataset = \"folder\"\n{data_dir}{extra}"),
        )
    };
    let c = ok(&folder("[data.folder]\nsize = 16\nchannels = 1\n"));
    assert_eq!(c.data.dataset, Dataset::Folder);
    assert_eq!(c.data.data_dir.as_deref(), Some(dir.0.as_path()));
    assert_eq!(
        c.data.folder,
        Some(FolderConfig {
            channels: 1,
            ..FolderConfig::new(16)
        })
    );
    assert_eq!((c.data.channels(), c.data.image_size()), (1, (16, 16)));
    assert_eq!((c.data.num_classes(), c.model.num_classes), (3, 3));
    let j = serde_json::to_value(&c).unwrap();
    assert_eq!(j["data"]["folder"]["on_bad_file"], "stop");
    let c = ok(&folder("[data.folder]\nsize = 8\non_bad_file = \"skip\"\n"));
    let f = c.data.folder.unwrap();
    assert_eq!((f.channels, f.on_bad_file), (3, OnBadFile::Skip));
    assert!(!f.jpeg_dct_scale && !f.train_plan().jpeg_dct_scale);
    let c = ok(&folder("[data.folder]\nsize = 8\njpeg_dct_scale = true\n"));
    let f = c.data.folder.unwrap();
    assert!(f.jpeg_dct_scale && f.train_plan().jpeg_dct_scale && !f.eval_plan().jpeg_dct_scale);

    use ErrorKind::{InvalidValue, MissingKey, UnknownKey};
    let no_train = MINIMAL.replace(
        "dataset = \"fashion-mnist\"\n",
        "dataset = \"folder\"\ndata_dir = \"/nowhere\"\n[data.folder]\nsize = 8\n",
    );
    check(vec![
        case(
            "folder without data_dir",
            MINIMAL.replace("\"fashion-mnist\"", "\"folder\""),
            MissingKey,
            "data.data_dir",
            Some(2),
            "the image folder",
        ),
        case(
            "folder without [data.folder]",
            folder(""),
            MissingKey,
            "data.folder",
            Some(2),
            "the image `size`",
        ),
        case(
            "folder without size",
            folder("[data.folder]\nchannels = 3\n"),
            MissingKey,
            "data.folder.size",
            Some(5),
            "resized (shorter side) and centre-cropped",
        ),
        case(
            "two channels",
            folder("[data.folder]\nsize = 8\nchannels = 2\n"),
            InvalidValue,
            "data.folder.channels",
            Some(7),
            "must be 1 (luma) or 3 (RGB), got 2",
        ),
        case(
            "jpeg_dct_scale not a boolean",
            folder("[data.folder]\nsize = 8\njpeg_dct_scale = \"yes\"\n"),
            ErrorKind::WrongType,
            "data.folder.jpeg_dct_scale",
            Some(7),
            "true or false",
        ),
        case(
            "unknown on_bad_file",
            folder("[data.folder]\nsize = 8\non_bad_file = \"ignore\"\n"),
            InvalidValue,
            "data.folder.on_bad_file",
            Some(7),
            "expected \"stop\" or \"skip\"",
        ),
        case(
            "no train folder",
            no_train,
            InvalidValue,
            "data.data_dir",
            Some(4),
            "/nowhere/train: no such folder",
        ),
        case(
            "folder for fashion-mnist",
            with("[data.folder]\nsize = 8\n"),
            UnknownKey,
            "data.folder",
            Some(10),
            "only applies to dataset = \"folder\"",
        ),
    ]);
}

#[test]
fn shards_keys_are_checked_by_name_and_line() {
    use ErrorKind::{InvalidValue, MissingKey, UnknownKey};
    // Line 3 `dataset`, 4 `data_dir`, then the extra lines from 5.
    let shards = |format: &str, extra: &str| {
        MINIMAL.replace(
            "dataset = \"fashion-mnist\"\n",
            &format!("dataset = \"{format}\"\ndata_dir = \"/shards\"\n{extra}"),
        )
    };
    let c = ok(&shards(
        "mds",
        "[data.shards]\nsize = 16\nclasses = 3\nimage = \"jpg\"\n",
    ));
    let s = c.data.shards.expect("[data.shards]");
    assert_eq!((s.images.size, s.classes, s.image.as_str()), (16, 3, "jpg"));
    assert_eq!(s.label, "y");
    check(vec![
        case(
            "a misspelt key",
            shards("mds", "[data.shards]\nsize = 16\nclases = 3\n"),
            UnknownKey,
            "data.shards.clases",
            Some(7),
            "classes",
        ),
        case(
            "no size",
            shards("wds", "[data.shards]\nclasses = 3\n"),
            MissingKey,
            "data.shards.size",
            Some(5),
            "the side of the square samples",
        ),
        case(
            "no classes",
            shards("mds", "[data.shards]\nsize = 16\n"),
            MissingKey,
            "data.shards.classes",
            Some(5),
            "labels lie in 0..classes",
        ),
        case(
            "no [data.shards]",
            shards("mds", ""),
            MissingKey,
            "data.shards",
            Some(2),
            "the image `size` and the number of `classes`",
        ),
        case(
            "no data_dir",
            MINIMAL.replace("\"fashion-mnist\"", "\"wds\""),
            MissingKey,
            "data.data_dir",
            Some(2),
            "split folders (train/, val/)",
        ),
        case(
            "an empty column name",
            shards(
                "mds",
                "[data.shards]\nsize = 16\nclasses = 3\nlabel = \" \"\n",
            ),
            InvalidValue,
            "data.shards.label",
            Some(8),
            "must not be empty",
        ),
        case(
            "shuffle_block 0",
            shards(
                "mds",
                "[data.shards]\nsize = 16\nclasses = 3\nshuffle_block = 0\n",
            ),
            InvalidValue,
            "data.shards.shuffle_block",
            Some(8),
            "",
        ),
        case(
            "[data.shards] for another dataset",
            with("[data.shards]\nsize = 8\nclasses = 2\n"),
            UnknownKey,
            "data.shards",
            Some(10),
            "only applies to dataset = \"mds\" or \"wds\"",
        ),
    ]);
}

#[test]
fn shard_cache_keys_and_remote_data_dir() {
    let mds = |data_dir: &str, extra: &str| {
        MINIMAL.replace(
            "dataset = \"fashion-mnist\"\n",
            &format!(
                "dataset = \"mds\"\ndata_dir = {data_dir:?}\n[data.shards]\nsize = 8\nclasses = 10\n{extra}"
            ),
        )
    };
    let c = ok(&mds(
        "s3://bucket/some/prefix",
        "cache_limit = \"1.5GB\"\nprefetch_shards = 3\ncache_dir = \"cache\"\n",
    ));
    // A remote is kept as written; a local folder is resolved against the config's folder.
    assert_eq!(
        c.data.data_dir.as_deref(),
        Some(Path::new("s3://bucket/some/prefix"))
    );
    let s = c.data.shards.unwrap();
    assert_eq!(s.cache_limit, 1_500_000_000);
    assert_eq!(s.prefetch_shards, Some(3));
    assert_eq!(s.cache_dir.as_deref(), Some(Path::new("/base/dir/cache")));
    let c = ok(&mds("shards", ""));
    assert_eq!(
        c.data.data_dir.as_deref(),
        Some(Path::new("/base/dir/shards"))
    );
    let s = c.data.shards.unwrap();
    assert_eq!((s.cache_limit, s.prefetch_shards), (10_000_000_000, None));
    let e = err(&mds("shards", "cache_limit = \"lots\"\n")).to_string();
    assert!(e.contains("cache_limit") && e.contains("`lots`"), "{e}");
    let e = err(&mds("shards", "cache_limit = \"0MB\"\n")).to_string();
    assert!(e.contains("cache_limit"), "{e}");
    // A URL without a bucket, at the config's line; WebDataset shards from S3.
    for url in ["s3://", "s3:///prefix"] {
        let e = err(&mds(url, "")).to_string();
        assert!(
            e.contains("data.data_dir") && e.contains("no bucket name"),
            "{e}"
        );
    }
    let e = err(&mds("s3://bucket/x", "").replace("\"mds\"", "\"wds\"")).to_string();
    assert!(
        e.contains("data.data_dir") && e.contains("for dataset = \"mds\" only"),
        "{e}"
    );
}
