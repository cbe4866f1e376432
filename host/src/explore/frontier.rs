//! The Pareto frontier (no other point is both cheaper and better) and the speed-up at equal
//! quality over the baseline.

use super::load::Run;
use super::point::{Point, TimeToBaseline};
use super::quality::QualityMetric;

/// For each point `(cost[i], quality[i])`, whether no other point dominates it: costs no more
/// and is at least as good, and is strictly cheaper or strictly better.
pub fn non_dominated(cost: &[f64], quality: &[f64], metric: QualityMetric) -> Vec<bool> {
    let dominates = |j: usize, i: usize| {
        cost[j] <= cost[i]
            && metric.meets(quality[j], quality[i])
            && (cost[j] < cost[i] || metric.better(quality[j], quality[i]))
    };
    (0..cost.len())
        .map(|i| !(0..cost.len()).any(|j| j != i && dominates(j, i)))
        .collect()
}

/// The baseline among `points`: recipe `baseline`; of several, the one trained longest (most
/// batches at its last evaluation, on average).
pub fn baseline_index(points: &[Point]) -> Option<usize> {
    let batches = |p: &Point| {
        p.runs
            .iter()
            .map(|r| r.evals.last().map_or(0, |e| e.batch) as f64)
            .sum::<f64>()
            / p.runs.len().max(1) as f64
    };
    points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.recipe == "baseline")
        .max_by(|(_, a), (_, b)| batches(a).total_cmp(&batches(b)))
        .map(|(i, _)| i)
}

/// The wall seconds at the first evaluation of `run` that meets `target`; `Err(())` when the
/// record has no evaluation times.
fn first_time_meeting(run: &Run, metric: QualityMetric, target: f64) -> Result<Option<f64>, ()> {
    if run.eval_times.is_empty() {
        return Err(());
    }
    Ok(run
        .evals
        .iter()
        .zip(&run.eval_times)
        .find(|(e, _)| metric.of(e).is_some_and(|q| metric.meets(q, target)))
        .map(|(_, t)| t.wall_seconds))
}

/// When `runs` (the seeds of one point) reached the baseline's quality `target`: the mean over
/// seeds of each one's first time, and the speed-up `baseline_seconds` / that.
pub fn time_to_baseline(
    runs: &[Run],
    metric: QualityMetric,
    target: f64,
    baseline_seconds: f64,
) -> TimeToBaseline {
    let mut times = Vec::with_capacity(runs.len());
    for run in runs {
        match first_time_meeting(run, metric, target) {
            Err(()) => return TimeToBaseline::NoEvalTimes,
            Ok(None) => return TimeToBaseline::NotReached,
            Ok(Some(t)) => times.push(t),
        }
    }
    if times.is_empty() {
        return TimeToBaseline::NotReached;
    }
    let seconds = times.iter().sum::<f64>() / times.len() as f64;
    TimeToBaseline::Reached {
        seconds,
        speedup: baseline_seconds / seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::group::group_runs;
    use crate::explore::test_support::run;
    use crate::explore::Pricing;

    #[test]
    fn dominated_points_are_off_the_frontier() {
        // (seconds, accuracy): b is slower and worse than a; c is slower but better; d ties a's
        // accuracy but is slower.
        let cost = [10.0, 20.0, 30.0, 15.0];
        let acc = [0.8, 0.7, 0.9, 0.8];
        assert_eq!(
            non_dominated(&cost, &acc, QualityMetric::Accuracy),
            vec![true, false, true, false]
        );
        // Perplexity: lower is better, so the order flips.
        let ppl = [30.0, 20.0, 10.0, 30.0];
        assert_eq!(
            non_dominated(&cost, &ppl, QualityMetric::Perplexity),
            vec![true, true, true, false]
        );
        // Two identical points both stay.
        assert_eq!(
            non_dominated(&[1.0, 1.0], &[0.5, 0.5], QualityMetric::Accuracy),
            vec![true, true]
        );
    }

    #[test]
    fn speedup_at_equal_quality_over_the_baseline() {
        // Baseline: two seeds ending at 0.80 and 0.84 (mean 0.82) after 100 s.
        // Fast: reaches 0.82 at 20 s (seed 1) and 30 s (seed 2): 25 s, speed-up 4.
        // Slow: one seed never reaches 0.82.
        let runs = vec![
            run("b1", "baseline", 1, &[(50.0, 0.7), (100.0, 0.80)], 100.0),
            run("b2", "baseline", 2, &[(50.0, 0.75), (100.0, 0.84)], 100.0),
            run("f1", "fast", 1, &[(20.0, 0.82), (40.0, 0.85)], 40.0),
            run("f2", "fast", 2, &[(30.0, 0.83), (40.0, 0.86)], 40.0),
            run("s1", "slow", 1, &[(60.0, 0.85)], 60.0),
            run("s2", "slow", 2, &[(60.0, 0.81)], 60.0),
        ];
        let (groups, skipped) = group_runs(runs, None, &Pricing::Recorded);
        assert!(skipped.is_empty());
        assert_eq!(groups.len(), 1);
        let g = &groups[0];
        let recipes: Vec<&str> = g.points.iter().map(|p| p.recipe.as_str()).collect();
        assert_eq!(recipes, ["fast", "slow", "baseline"], "by wall time");
        let fast = &g.points[0];
        assert_eq!(
            fast.time_to_baseline,
            TimeToBaseline::Reached {
                seconds: 25.0,
                speedup: 4.0
            }
        );
        assert_eq!(g.points[1].time_to_baseline, TimeToBaseline::NotReached);
        assert_eq!(g.points[2].time_to_baseline.speedup(), Some(1.0));
        assert_eq!(g.baseline, Some(2));
        let frontier: Vec<bool> = g.points.iter().map(|p| p.on_time_frontier).collect();
        assert_eq!(
            frontier,
            [true, false, false],
            "fast is faster and better than both"
        );
        assert!((g.points[2].quality.mean() - 0.82).abs() < 1e-12);
        assert!((g.points[2].quality.spread() - 0.02).abs() < 1e-12);
    }

    #[test]
    fn without_a_baseline_there_is_no_speedup_and_the_longest_baseline_wins() {
        let runs = vec![run("a", "fast", 1, &[(1.0, 0.5)], 1.0)];
        let (groups, _) = group_runs(runs, None, &Pricing::Recorded);
        assert_eq!(groups[0].baseline, None);
        assert_eq!(
            groups[0].points[0].time_to_baseline,
            TimeToBaseline::NoBaseline
        );

        let mut short = run("short", "baseline", 1, &[(5.0, 0.5)], 5.0);
        short.config["train"] = serde_json::json!({"max_duration": "1ep"});
        let long = run("long", "baseline", 1, &[(5.0, 0.5), (9.0, 0.6)], 9.0);
        let (groups, _) = group_runs(vec![short, long], None, &Pricing::Recorded);
        let g = &groups[0];
        assert_eq!(g.points.len(), 2, "different configs are different points");
        assert_eq!(
            g.baseline_point().map(|p| p.runs[0].run_name.as_str()),
            Some("long")
        );
    }

    #[test]
    fn repricing_makes_costs_and_a_cost_frontier() {
        let runs = vec![
            run("a", "baseline", 1, &[(3600.0, 0.8)], 3600.0),
            run("b", "fast", 1, &[(1800.0, 0.7)], 1800.0),
        ];
        let (groups, _) = group_runs(runs, None, &Pricing::PerHour(2.0));
        let costs: Vec<f64> = groups[0]
            .points
            .iter()
            .map(|p| p.cost_usd.as_ref().map(|c| c.mean()).unwrap_or(-1.0))
            .collect();
        assert_eq!(costs, [1.0, 2.0]);
        assert!(groups[0].points.iter().all(|p| p.on_cost_frontier));

        // A run over two nodes pays for both: half the time, the same cost.
        let record = serde_json::json!({
            "run_name": "c", "recipe": "fast", "nodes": 2, "wall_seconds": 1800.0,
            "config": {"seed": 1, "data": {"dataset": "fashion-mnist"},
                       "model": {"name": "cnn", "width": 8}},
            "evals": [{"epoch": 1, "batch": 1, "accuracy": 0.8, "cross_entropy": 1.0,
                       "samples": 10}],
        });
        let two_nodes = crate::explore::Run::from_value("c/run.json", record, None).unwrap();
        assert_eq!(two_nodes.nodes, 2);
        let (groups, _) = group_runs(vec![two_nodes.clone()], None, &Pricing::PerHour(2.0));
        assert_eq!(
            groups[0].points[0].cost_usd.as_ref().map(|c| c.mean()),
            Some(2.0)
        );
        let presets = crate::cost::Instances::builtin().unwrap();
        let p4d = presets.get("aws/p4d.24xlarge").unwrap().clone();
        let price = p4d.usd_per_hour;
        let (groups, _) = group_runs(vec![two_nodes], None, &Pricing::Instance(p4d));
        let cost = groups[0].points[0].cost_usd.as_ref().map(|c| c.mean());
        assert!(
            (cost.unwrap_or(-1.0) - price).abs() < 1e-9,
            "half an hour on two nodes costs one hour's price: {cost:?}"
        );
        let (groups, _) = group_runs(
            vec![run("a", "baseline", 1, &[(1.0, 0.8)], 1.0)],
            None,
            &Pricing::Recorded,
        );
        assert!(groups[0].points[0].cost_usd.is_none(), "no recorded cost");
    }
}
