// MarqueeCore
