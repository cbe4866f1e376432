//! Units of training time: plugin-api's [`TimeUnit`], so the host and methods name the same seven
//! units with the same suffixes (`iter`, `ep`, `ba`, `sp`, `tok`, `dur`, `sec`).

pub use tessera_plugin_api::TimeUnit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_duration_is_fractional() {
        assert!(!TimeUnit::Duration.is_count());
        assert!(TimeUnit::ALL
            .into_iter()
            .filter(|u| *u != TimeUnit::Duration)
            .all(TimeUnit::is_count));
    }
}
