"""``enflame-scheduler-extender``: kube-scheduler extender preferring nodes with local GCU sets."""
