#![doc = include_str!("../README.md")]

use serde::{Deserialize, Serialize};
use tessera_plugin_api::kit::{json_state, StateReader};
use tessera_plugin_api::{
    export_plugin, Context, Error, EvalResults, Event, Hook, Method, Plugin, Settings, State, Time,
    TimeUnit,
};

/// How a new value is compared with the best so far (`comp(current, best)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// Higher is better (`torch.greater`).
    Greater,
    /// Lower is better (`torch.less`).
    Less,
}

impl Comparison {
    /// Composer's default for a monitored metric: lower is better when the name contains
    /// `loss`, `error` or `perplexity` — and, in Tessera, `entropy` (see the method card).
    pub fn default_for(monitor: &str) -> Comparison {
        let name = monitor.to_lowercase();
        if ["loss", "error", "perplexity", "entropy"]
            .iter()
            .any(|s| name.contains(s))
        {
            Comparison::Less
        } else {
            Comparison::Greater
        }
    }

    /// `comp` as Composer spells it: `greater`/`gt` or `less`/`lt` (any case).
    pub fn parse(text: &str) -> Option<Comparison> {
        match text.to_lowercase().as_str() {
            "greater" | "gt" => Some(Comparison::Greater),
            "less" | "lt" => Some(Comparison::Less),
            _ => None,
        }
    }

    fn better(self, value: f64, best: f64) -> bool {
        match self {
            Comparison::Greater => value > best,
            Comparison::Less => value < best,
        }
    }
}

/// Patience: how long the metric may go without improving, in epochs or batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// Epochs.
    Epochs(u64),
    /// Batches.
    Batches(u64),
}

/// The best value so far and when it occurred (epoch, batch).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// The best value of the monitored metric.
    pub value: f64,
    /// The epoch count when it was measured.
    pub epoch: u64,
    /// The batch count when it was measured.
    pub batch: u64,
}

/// Composer's `EarlyStopper._update_stopper_state`: updates `best` with the value measured at
/// (`epoch`, `batch`) and says whether training should stop. The first value is the best; a
/// later one replaces it when `comp(value, best)` and `|value - best| > min_delta`. Stop when
/// more than `patience` epochs (or batches) have passed since the best.
pub fn update(
    best: &mut Option<Best>,
    value: f64,
    epoch: u64,
    batch: u64,
    comp: Comparison,
    min_delta: f64,
    patience: Patience,
) -> bool {
    let now = Best {
        value,
        epoch,
        batch,
    };
    match best {
        None => *best = Some(now),
        Some(b) if comp.better(value, b.value) && (value - b.value).abs() > min_delta => *b = now,
        Some(_) => {}
    }
    let Some(b) = best else { return false };
    match patience {
        Patience::Epochs(p) => epoch.saturating_sub(b.epoch) > p,
        Patience::Batches(p) => batch.saturating_sub(b.batch) > p,
    }
}

/// The early-stopping method.
pub struct EarlyStopping {
    monitor: String,
    comp: Comparison,
    min_delta: f64,
    patience: Patience,
    best: Option<Best>,
}

impl EarlyStopping {
    fn monitored(&self, results: &EvalResults) -> Result<f64, Error> {
        results.metric(&self.monitor).ok_or_else(|| {
            let names: Vec<&str> = results.metrics.iter().map(|m| m.name.as_str()).collect();
            Error::config(format!(
                "`monitor`: the evaluation has no metric `{}` (it has: {})",
                self.monitor,
                names.join(", ")
            ))
        })
    }
}

const STATE_FORMAT: u32 = 1;

impl Method for EarlyStopping {
    fn on_event(&mut self, _event: Event, ctx: &mut Context<'_>) -> Result<(), Error> {
        let Some(results) = ctx.eval_results()? else {
            return Ok(());
        };
        let value = self.monitored(&results)?;
        let stop = update(
            &mut self.best,
            value,
            results.epoch,
            results.batch,
            self.comp,
            self.min_delta,
            self.patience,
        );
        if let Some(best) = self.best {
            ctx.log_metric("early_stopping/best", best.value);
        }
        if stop {
            let (best, since) = match (self.best, self.patience) {
                (Some(b), Patience::Epochs(_)) => (b.value, format!("epoch {}", b.epoch)),
                (Some(b), Patience::Batches(_)) => (b.value, format!("batch {}", b.batch)),
                (None, _) => (value, String::from("the start")),
            };
            ctx.request_stop(&format!(
                "early_stopping: {} has not improved on {best} (by more than {}) since {since}",
                self.monitor, self.min_delta
            ))?;
        }
        Ok(())
    }

    fn state(&self) -> Result<State, Error> {
        json_state("early_stopping", STATE_FORMAT, &self.best, Vec::new())
    }

    fn load_state(&mut self, state: State) -> Result<(), Error> {
        let reader = StateReader::open("early_stopping", state, STATE_FORMAT)?;
        self.best = reader.json()?;
        reader.finish()?;
        Ok(())
    }
}

/// `patience` as an integer (epochs, as Composer reads an `int`) or a time string in `ep` or
/// `ba`.
fn parse_patience(settings: &Settings) -> Result<Patience, Error> {
    let value: serde_json::Value = settings.get_or("patience", serde_json::json!(1))?;
    let time = match &value {
        serde_json::Value::Number(n) => match n.as_u64() {
            Some(epochs) => return Ok(Patience::Epochs(epochs)),
            None => None,
        },
        serde_json::Value::String(s) => Time::parse(s).ok(),
        _ => None,
    };
    match time.map(|t| (t.unit(), t.count())) {
        Some((TimeUnit::Epoch, Some(n))) => Ok(Patience::Epochs(n)),
        Some((TimeUnit::Batch, Some(n))) => Ok(Patience::Batches(n)),
        _ => Err(Error::config(format!(
            "`patience` must be a whole number of epochs (3) or a time in epochs or batches (\"3ep\", \"500ba\"), got {value}"
        ))),
    }
}

impl Plugin for EarlyStopping {
    const NAME: &'static str = "early_stopping";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str =
        "stops training when an evaluation metric has not improved for `patience` epochs or batches";
    const DEFAULT_SETTINGS: &'static str = "monitor = \"accuracy\"\ndataloader_label = \"eval\"\nmin_delta = 0.0\npatience = 1\n# comp = \"greater\"   # default: by the monitor's name";

    fn hooks() -> Vec<Hook> {
        vec![Hook::at(Event::EVAL_END)]
    }

    fn create(settings: &Settings) -> Result<Self, Error> {
        let monitor = settings.str("monitor")?;
        let label = settings.str("dataloader_label")?;
        if label != "eval" {
            return Err(Error::config(format!(
                "`dataloader_label` = {label:?}: Tessera exposes the evaluation's metrics only (\"eval\"); training metrics cannot be monitored yet"
            )));
        }
        let comp = match settings.get_or::<Option<String>>("comp", None)? {
            None => Comparison::default_for(&monitor),
            Some(text) => Comparison::parse(&text).ok_or_else(|| {
                Error::config(format!(
                    "`comp` = {text:?}: use \"greater\" (\"gt\") or \"less\" (\"lt\")"
                ))
            })?,
        };
        let min_delta = settings.f64("min_delta")?;
        if !min_delta.is_finite() {
            return Err(Error::config(format!(
                "`min_delta` must be a finite number, got {min_delta}"
            )));
        }
        Ok(EarlyStopping {
            monitor,
            comp,
            // As Composer: the sign of min_delta does not matter.
            min_delta: min_delta.abs(),
            patience: parse_patience(settings)?,
            best: None,
        })
    }
}

export_plugin!(EarlyStopping);
