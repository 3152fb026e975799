"""The statistics pairreg decides with: acceptance intervals, drift tests between
measurements, and the sequential test on online acceptance.
"""
