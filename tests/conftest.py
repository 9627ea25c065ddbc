import os
import sys

import torch as th

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
th.set_num_threads(1)
