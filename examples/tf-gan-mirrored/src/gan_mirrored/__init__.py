"""A class-conditional GAN on scikit-learn's 8x8 digits: two networks, two optimizers"""
