"""The run plane: the check of the instance's storage (:mod:`.instance`) and the Celery run
launcher that notices a worker host that died (:mod:`.celery_launcher`, the ``celery`` extra)."""
