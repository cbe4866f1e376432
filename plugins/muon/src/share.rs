//! Sharing the orthogonalization between the ranks of a data-parallel run: each matrix is
//! given to one rank (greedily, largest Newton–Schulz cost first, to the least-loaded rank), each
//! rank orthogonalizes its matrices batched by shape, and one all-gather per step hands every
//! rank every result. KellerJordan/Muon's distributed `Muon` and modded-nanogpt share by matrix
//! the same way; the momentum stays whole on every rank (it is the gradients' size, which every
//! rank holds anyway), so checkpoints and resumes on other rank counts are unchanged.

use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_plugin_api::Error;

use crate::config::MuonConfig;
use crate::update::newton_schulz;

/// Who orthogonalizes what, the same on every rank (it depends on the shapes alone).
pub struct Plan {
    rank: usize,
    /// `[rank][group]`: the matrices (indices into the group, ascending) of that rank.
    owned: Vec<Vec<Vec<i64>>>,
    /// `[rank][group]`: `owned` as an index tensor on the device (none when empty).
    index: Vec<Vec<Option<Tensor>>>,
    /// Elements each rank sends: the sum of its matrices' sizes.
    sent: Vec<i64>,
    /// `(rows, cols)` of each group's matrices.
    shapes: Vec<(i64, i64)>,
}

impl Plan {
    /// The plan for `groups` (`(matrices, rows, cols)` each) over `world` ranks, seen from
    /// `rank`; index tensors on `device`.
    pub fn new(
        groups: &[(i64, i64, i64)],
        rank: usize,
        world: usize,
        device: Device,
    ) -> Result<Plan, Error> {
        let world = world.max(1);
        // Newton–Schulz on an r × c matrix (r ≤ c after transposing) costs ~ r²·c per iteration.
        let mut matrices: Vec<(usize, i64, i64)> = Vec::new();
        for (g, &(n, rows, cols)) in groups.iter().enumerate() {
            let cost = rows.min(cols).pow(2) * rows.max(cols);
            matrices.extend((0..n).map(|i| (g, i, cost)));
        }
        // Largest first; ties in the groups' order, so every rank computes the same plan.
        matrices.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
        let mut load = vec![0i64; world];
        let mut owned = vec![vec![Vec::new(); groups.len()]; world];
        for (g, i, cost) in matrices {
            let r = (0..world).min_by_key(|&r| (load[r], r)).unwrap_or(0);
            load[r] += cost;
            owned[r][g].push(i);
        }
        let mut index = Vec::with_capacity(world);
        let mut sent = Vec::with_capacity(world);
        for per_group in &mut owned {
            let mut row = Vec::with_capacity(groups.len());
            let mut elements = 0;
            for (g, idx) in per_group.iter_mut().enumerate() {
                idx.sort_unstable();
                elements += idx.len() as i64 * groups[g].1 * groups[g].2;
                row.push(if idx.is_empty() {
                    None
                } else {
                    Some(Tensor::f_from_slice(idx)?.f_to_device(device)?)
                });
            }
            index.push(row);
            sent.push(elements);
        }
        Ok(Plan {
            rank,
            owned,
            index,
            sent,
            shapes: groups.iter().map(|&(_, r, c)| (r, c)).collect(),
        })
    }

    /// How many matrices this rank orthogonalizes.
    pub fn mine(&self) -> usize {
        self.owned[self.rank].iter().map(Vec::len).sum()
    }

    /// [`newton_schulz`] of every group's `updates` (`(n, rows, cols)` each): this rank's
    /// matrices computed here, the others received through `gather` (which stacks every rank's
    /// tensor in rank order, `Context::all_gather`). Bfloat16, exactly as each rank computed it.
    pub fn orthogonalize(
        &self,
        updates: &[Tensor],
        config: &MuonConfig,
        gather: &mut dyn FnMut(&Tensor) -> Result<Tensor, Error>,
    ) -> Result<Vec<Tensor>, Error> {
        let Some(first) = updates.first() else {
            return Ok(Vec::new());
        };
        let device = first.device();
        let width = self.sent.iter().copied().max().unwrap_or(0);
        // This rank's results, flat in group order, padded to the widest rank's.
        let mut parts = Vec::new();
        for (g, update) in updates.iter().enumerate() {
            if let Some(idx) = &self.index[self.rank][g] {
                let mine = newton_schulz(&update.f_index_select(0, idx)?, config)?;
                parts.push(mine.f_reshape([-1])?);
            }
        }
        let pad = width - self.sent[self.rank];
        if pad > 0 || parts.is_empty() {
            parts.push(Tensor::f_zeros([pad], (Kind::BFloat16, device))?);
        }
        let all = gather(&Tensor::f_cat(&parts, 0)?)?;
        let mut out = updates
            .iter()
            .map(|u| Tensor::f_empty(u.size().as_slice(), (Kind::BFloat16, device)))
            .collect::<Result<Vec<_>, _>>()?;
        for (r, per_group) in self.index.iter().enumerate() {
            let from = all.f_select(0, r as i64)?;
            let mut at = 0;
            for (g, idx) in per_group.iter().enumerate() {
                let Some(idx) = idx else { continue };
                let (rows, cols) = self.shapes[g];
                let k = self.owned[r][g].len() as i64;
                let part = from
                    .f_narrow(0, at, k * rows * cols)?
                    .f_view([k, rows, cols])?;
                let _ = out[g].f_index_copy_(0, idx, &part)?;
                at += k * rows * cols;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_matrix_has_one_rank_and_the_load_is_balanced() {
        // Shapes of a tiny GPT: 4 layers of (qkv 3C×C, proj C×C, fc 4C×C, fc_proj C×4C).
        let groups = [
            (4, 96, 32),
            (4, 32, 32),
            (4, 128, 32),
            (4, 32, 128),
            (1, 8, 9),
        ];
        for world in 1..=5 {
            let plans: Vec<Plan> = (0..world)
                .map(|r| Plan::new(&groups, r, world, Device::Cpu).unwrap())
                .collect();
            for (g, &(n, _, _)) in groups.iter().enumerate() {
                let mut seen: Vec<i64> = plans[0]
                    .owned
                    .iter()
                    .flat_map(|per_group| per_group[g].iter().copied())
                    .collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "group {g}, {world} ranks");
            }
            // Every rank computed the same plan.
            assert!(plans.iter().all(|p| p.owned == plans[0].owned));
            let total: usize = plans.iter().map(Plan::mine).sum();
            assert_eq!(total, 17);
            // Greedy largest-first: no rank carries more than the average plus the largest
            // matrix's cost.
            let cost = |r: usize| -> i64 {
                plans[0].owned[r]
                    .iter()
                    .zip(&groups)
                    .map(|(idx, &(_, a, b))| idx.len() as i64 * a.min(b).pow(2) * a.max(b))
                    .sum()
            };
            let all: i64 = (0..world).map(cost).sum();
            let largest = 32 * 32 * 128;
            for r in 0..world {
                assert!(
                    cost(r) <= all / world as i64 + largest,
                    "rank {r} of {world}"
                );
            }
        }
    }

    #[test]
    fn the_gathered_results_are_each_ranks_own() {
        // Two ranks simulated in one process: each computes its share, the gather stacks both.
        let defaults = tessera_plugin_api::Settings::default()
            .with_defaults(<crate::Muon as tessera_plugin_api::Plugin>::DEFAULT_SETTINGS);
        let config = MuonConfig::from_settings(&defaults.unwrap()).unwrap();
        tessera_plugin_api::tch::manual_seed(3);
        let updates = vec![
            Tensor::randn([3, 6, 10], (Kind::Float, Device::Cpu)),
            Tensor::randn([2, 12, 4], (Kind::Float, Device::Cpu)),
        ];
        let groups = [(3, 6, 10), (2, 12, 4)];
        let plans: Vec<Plan> = (0..2)
            .map(|r| Plan::new(&groups, r, 2, Device::Cpu).unwrap())
            .collect();
        // What each rank sends, found by running its share with a gather that records it.
        let sent: Vec<Tensor> = plans
            .iter()
            .map(|p| {
                let mut got = None;
                let mut record = |t: &Tensor| -> Result<Tensor, Error> {
                    got = Some(t.shallow_clone());
                    Ok(Tensor::stack(&[t.shallow_clone(), t.shallow_clone()], 0))
                };
                p.orthogonalize(&updates, &config, &mut record).unwrap();
                got.unwrap()
            })
            .collect();
        let mut both = |_: &Tensor| -> Result<Tensor, Error> {
            Ok(Tensor::stack(
                &[sent[0].shallow_clone(), sent[1].shallow_clone()],
                0,
            ))
        };
        let shared = plans[1]
            .orthogonalize(&updates, &config, &mut both)
            .unwrap();
        for (u, s) in updates.iter().zip(&shared) {
            let whole = newton_schulz(u, &config).unwrap();
            assert!(
                whole.equal(s),
                "shared results differ from the whole batch's"
            );
        }
    }
}
