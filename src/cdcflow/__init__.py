"""cdcflow: Kafka CDC topics to Delta Lake tables on PySpark.

See README.md for the two commands, and docs/ for formats, semantics and decisions.
"""

__version__ = "0.1.0"
