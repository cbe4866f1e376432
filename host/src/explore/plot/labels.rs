//! Placing point labels so that none overlaps another label, a marker or the plot's edge:
//! greedy, one label at a time, trying positions around its point from near to far.

/// An upright box on the canvas, pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Area {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Right edge.
    pub right: f64,
    /// Bottom edge.
    pub bottom: f64,
}

impl Area {
    /// The box of `size` centred on `centre`.
    pub fn around(centre: (f64, f64), size: (f64, f64)) -> Area {
        Area {
            left: centre.0 - size.0 / 2.0,
            top: centre.1 - size.1 / 2.0,
            right: centre.0 + size.0 / 2.0,
            bottom: centre.1 + size.1 / 2.0,
        }
    }

    /// Its centre.
    pub fn centre(&self) -> (f64, f64) {
        (
            (self.left + self.right) / 2.0,
            (self.top + self.bottom) / 2.0,
        )
    }

    /// The area both cover (0 when they do not overlap).
    pub fn overlap(&self, other: &Area) -> f64 {
        let w = self.right.min(other.right) - self.left.max(other.left);
        let h = self.bottom.min(other.bottom) - self.top.max(other.top);
        if w > 0.0 && h > 0.0 {
            w * h
        } else {
            0.0
        }
    }

    fn inside(&self, bounds: &Area) -> bool {
        self.left >= bounds.left
            && self.top >= bounds.top
            && self.right <= bounds.right
            && self.bottom <= bounds.bottom
    }
}

/// Where a label went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    /// Its box.
    pub area: Area,
    /// Far enough from its point to need a line to it.
    pub leader: bool,
}

/// Gaps tried between a point and its label's box, pixels, near to far; beyond the first the
/// label gets a leader line.
const GAPS: [f64; 6] = [9.0, 16.0, 26.0, 40.0, 58.0, 80.0];
/// Directions tried at each gap: right, up-right, down-right, up, down, up-left, down-left,
/// left.
const DIRECTIONS: [(f64, f64); 8] = [
    (1.0, 0.0),
    (1.0, -1.0),
    (1.0, 1.0),
    (0.0, -1.0),
    (0.0, 1.0),
    (-1.0, -1.0),
    (-1.0, 1.0),
    (-1.0, 0.0),
];

/// One box per label (`sizes[i]` for the point at `anchors[i]`), in order: the first position
/// around the point, near to far, that stays inside `bounds` and overlaps no obstacle (the
/// markers) and no label placed before; when there is none, the position that overlaps
/// least.
pub fn place_labels(
    anchors: &[(f64, f64)],
    sizes: &[(f64, f64)],
    obstacles: &[Area],
    bounds: Area,
) -> Vec<Placed> {
    let mut placed: Vec<Placed> = Vec::with_capacity(anchors.len());
    for (anchor, size) in anchors.iter().zip(sizes) {
        let candidates = GAPS.iter().enumerate().flat_map(|(i, gap)| {
            DIRECTIONS.iter().map(move |(dx, dy)| {
                // Diagonals sit a little closer, so that corners do not drift away.
                let g = if *dx != 0.0 && *dy != 0.0 {
                    gap * 0.7
                } else {
                    *gap
                };
                let centre = (
                    anchor.0 + dx * (g + size.0 / 2.0),
                    anchor.1 + dy * (g + size.1 / 2.0),
                );
                Placed {
                    area: Area::around(centre, *size),
                    leader: i > 0,
                }
            })
        });
        let overlap = |c: &Placed| -> f64 {
            let outside = if c.area.inside(&bounds) { 0.0 } else { 1e9 };
            outside
                + obstacles
                    .iter()
                    .chain(placed.iter().map(|p| &p.area))
                    .map(|o| c.area.overlap(o))
                    .sum::<f64>()
        };
        let mut best: Option<(f64, Placed)> = None;
        for c in candidates {
            let o = overlap(&c);
            if o == 0.0 {
                best = Some((0.0, c));
                break;
            }
            if best.as_ref().is_none_or(|(b, _)| o < *b) {
                best = Some((o, c));
            }
        }
        if let Some((_, c)) = best {
            placed.push(c);
        }
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crowded_labels_do_not_overlap() {
        // Five points within a few pixels of each other, each with its marker.
        let anchors: Vec<(f64, f64)> = (0..5)
            .map(|i| (200.0 + f64::from(i) * 3.0, 150.0 + f64::from(i % 2) * 4.0))
            .collect();
        let sizes = vec![(12.0, 15.0); 5];
        let markers: Vec<Area> = anchors
            .iter()
            .map(|a| Area::around(*a, (14.0, 14.0)))
            .collect();
        let bounds = Area {
            left: 0.0,
            top: 0.0,
            right: 400.0,
            bottom: 300.0,
        };
        let placed = place_labels(&anchors, &sizes, &markers, bounds);
        assert_eq!(placed.len(), 5);
        for (i, a) in placed.iter().enumerate() {
            assert!(a.area.inside(&bounds));
            for m in &markers {
                assert_eq!(a.area.overlap(m), 0.0, "label {i} on a marker");
            }
            for b in &placed[i + 1..] {
                assert_eq!(a.area.overlap(&b.area), 0.0, "labels overlap: {placed:?}");
            }
        }
        assert!(placed.iter().any(|p| p.leader), "some were pushed out");
        assert!(!placed[0].leader, "the first has room next to its point");
    }

    #[test]
    fn a_label_at_the_edge_goes_inward() {
        let bounds = Area {
            left: 0.0,
            top: 0.0,
            right: 100.0,
            bottom: 100.0,
        };
        let placed = place_labels(&[(98.0, 50.0)], &[(20.0, 10.0)], &[], bounds);
        assert!(placed[0].area.right <= 100.0 && placed[0].area.centre().0 < 98.0);
    }
}
