"""Analytic features of a network description: per-op formulas and their aggregation."""

from perf4sight.features.aggregate import (FEATURE_NAMES, NetworkFeatures, feature_matrix, features_for,
                                           network_features, unsupported_ops)

__all__ = ["FEATURE_NAMES", "NetworkFeatures", "feature_matrix", "features_for", "network_features",
           "unsupported_ops"]
