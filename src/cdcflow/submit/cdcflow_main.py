"""The application file ``spark-submit`` runs for cdcflow: its command line, as the
``cdcflow`` command (``spark-submit [options] <this file> run pipeline.yaml``).

It lives in a folder of its own because Python puts the script's folder first on
``sys.path``: run from inside the package, cdcflow's ``types.py`` would hide the
standard library's ``types``. ``python -m cdcflow.runtime.spark`` prints its path after the
options the ``delta-spark`` sink needs.
"""

from cdcflow.cli import entry

if __name__ == "__main__":
    entry()
