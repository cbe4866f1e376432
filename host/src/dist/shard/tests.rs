use super::*;

#[test]
fn dense_layouts_are_recognised() {
    assert!(dense(&[2, 3], &[3, 1]));
    assert!(dense(&[4, 3, 2, 2], &[12, 1, 6, 3]), "channels last");
    assert!(dense(&[5], &[1]));
    assert!(
        dense(&[1, 5], &[99, 1]),
        "size-1 dimensions have any stride"
    );
    assert!(!dense(&[2, 3], &[4, 1]), "padded rows");
    assert!(!dense(&[2, 2], &[1, 1]), "overlapping");
    assert!(!dense(&[3], &[0]), "expanded");
}

#[test]
fn an_alias_reads_the_storage_where_it_is_told() {
    let t = Tensor::arange(10, (Kind::Float, Device::Cpu));
    // A source that starts inside the storage (a view, as a gradient in a bucket is).
    let view = t.narrow(0, 3, 5);
    let a = alias(&view, 4, 3).unwrap();
    assert_eq!(Vec::<f32>::try_from(&a).unwrap(), [4.0, 5.0, 6.0]);
    let _ = a.shallow_clone().fill_(-1.0);
    assert_eq!(t.double_value(&[5]), -1.0, "shares the memory");
}

#[test]
fn pieces_tile_the_parameters_and_keep_their_values() {
    let a = Tensor::arange(10, (Kind::Float, Device::Cpu)).reshape([2, 5]);
    let b = Tensor::arange(3, (Kind::Float, Device::Cpu)) + 100.0;
    let params = vec![
        ("a".to_owned(), a.shallow_clone()),
        ("b".to_owned(), b.shallow_clone()),
    ];
    let world = 3;
    let mut covered = vec![0i64; 13];
    for rank in 0..world {
        let a2 = a.copy();
        let b2 = b.copy();
        let own = vec![
            ("a".to_owned(), a2.shallow_clone()),
            ("b".to_owned(), b2.shallow_clone()),
        ];
        let s = ShardedParams::new(Sharding::Optimizer, &own, rank, world, 1 << 20, &[]).unwrap();
        assert_eq!(s.pieces().len(), 2);
        // The parameters kept their values and are views of the buffer now.
        assert!(a2.equal(&a) && b2.equal(&b));
        for p in s.pieces() {
            let base = if p.name == "a" { 0 } else { 10 };
            for i in 0..p.len {
                covered[(base + p.start + i) as usize] += 1;
            }
            // A piece shares the parameter's memory.
            if p.len > 0 {
                let _ = p.tensor.shallow_clone().fill_(-1.0);
            }
        }
        let (mine, all) = s.elements();
        assert_eq!((mine, all), ([5, 5, 3][rank], 13));
        assert!(
            a2.lt(0.0).sum(Kind::Int64).int64_value(&[])
                + b2.lt(0.0).sum(Kind::Int64).int64_value(&[])
                == mine
        );
    }
    assert!(covered.iter().all(|c| *c == 1), "{covered:?}");
    drop(params);
}

#[test]
fn a_piece_of_a_whole_tensor_follows_the_parameter_layout() {
    // A channels-last parameter: its memory order is (n, h, w, c).
    let p = Tensor::empty_strided([2, 3, 2, 2], [12, 1, 6, 3], (Kind::Float, Device::Cpu));
    p.shallow_clone()
        .copy_(&Tensor::arange(24, (Kind::Float, Device::Cpu)).reshape([2, 3, 2, 2]));
    let params = vec![("w".to_owned(), p.shallow_clone())];
    let s = ShardedParams::new(Sharding::Optimizer, &params, 1, 2, 1 << 20, &[]).unwrap();
    let whole = Tensor::arange(24, (Kind::Float, Device::Cpu)).reshape([2, 3, 2, 2]);
    let view = s.view();
    let piece = crate::optim::Shards::cut(&view, "w", &whole)
        .unwrap()
        .unwrap();
    let own = &s.pieces()[0];
    assert_eq!(own.len, 12);
    assert!(piece.equal(&own.tensor), "{piece} vs {}", own.tensor);
    assert!(crate::optim::Shards::cut(&view, "nope", &whole).is_none());
}
