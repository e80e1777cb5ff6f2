"""Analytic features of a network description: per-op formulas and their aggregation (the graph
feature set the fingerprint uses), and ``perf4sight_set`` (the ``perf4sight-conv`` baseline set)."""

from perf4sight.features.aggregate import (FEATURE_NAMES, NetworkFeatures, feature_matrix, features_for,
                                           network_features, unsupported_ops)

__all__ = ["FEATURE_NAMES", "NetworkFeatures", "feature_matrix", "features_for", "network_features",
           "unsupported_ops"]
