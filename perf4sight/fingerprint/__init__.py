"""Per-device fingerprints: tree ensembles over graph features, stored without pickle."""

from perf4sight.fingerprint.fit import fit_fingerprint
from perf4sight.fingerprint.predict import (PREDICTION_KEYS, Fingerprint, accuracy_lines, for_loss, for_optimizer,
                                            load_fingerprint)

__all__ = ["fit_fingerprint", "load_fingerprint", "Fingerprint", "PREDICTION_KEYS", "accuracy_lines", "for_optimizer",
           "for_loss"]
