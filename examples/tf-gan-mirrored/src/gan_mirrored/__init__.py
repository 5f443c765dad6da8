"""A class-conditional GAN on scikit-learn's 8x8 digits: two networks, two optimizers"""

from .kit.moved import keep_old_import_paths

keep_old_import_paths(__name__)  # files written before kit/ existed import `.config` and the like
